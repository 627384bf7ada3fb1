"""gpucoll.MPI's process topologies and neighbourhood collectives, with exact results.

    gpurun -np 4 python mpi_topology.py      -> "RESULT {json}" per rank

A 2 x 2 grid periodic in its first dimension only (so shifts along the second fall off the edge),
a ring graph, and a distributed graph whose edges go to rank+1 and rank+2; each neighbourhood
collective sends values that name their sender and block. tests/test_mpi_topology.py computes
what each must be.
"""
import json

import numpy as np

from gpucoll import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {}

# --- Cartesian ------------------------------------------------------------------------------------
cart = comm.Create_cart([2, 2], periods=[True, False])
sub = cart.Sub([False, True])
out["cart"] = [type(cart).__name__, cart.topology == MPI.CART, cart.Get_topo(), cart.Shift(0, 1), cart.Shift(1, 1),
               cart.Get_cart_rank([1, 1]), cart.inoutedges, sub.Get_topo(), sub.size,
               type(MPI.Comm.fromint(cart.toint())).__name__, MPI.Compute_dims(n, 2), comm.Cart_map([3])]
try:
    MPI.Graphcomm(cart)
    out["cart"].append("no error")
except TypeError:
    out["cart"].append("TypeError")
small = comm.Create_cart([3])
out["cart"].append(small == MPI.COMM_NULL)
if small:
    small.Free()

sbuf = np.array([100 * r + k for k in range(4)], "i")  # block k: to out-neighbour k
rbuf = np.full(4, -1, "i")
cart.Neighbor_alltoall(sbuf, rbuf)
gathered = np.full(4, -1, "i")
cart.Ineighbor_allgather(np.array([r], "i"), gathered).Wait()
out["cart_neighbor"] = [rbuf.tolist(), gathered.tolist(), cart.neighbor_allgather(r)]

# --- graph: a ring -------------------------------------------------------------------------------
index = [2 * (k + 1) for k in range(n)]
edges = [e for k in range(n) for e in ((k - 1) % n, (k + 1) % n)]
graph = comm.Create_graph(index, edges)
vbuf = np.full(2 * 2, -1, "d")  # Neighbor_allgatherv: 2 values from each neighbour
graph.Neighbor_allgatherv(np.array([r, r + 0.5]), [vbuf, [2, 2], [0, 2], MPI.DOUBLE])
out["graph"] = [graph.Get_dims(), graph.Get_neighbors(r), graph.nneighbors, vbuf.tolist(),
                graph.neighbor_alltoall([f"{r}>{d}" for d in graph.Get_neighbors(r)])]

# --- distributed graph: edges r -> r+1 and r -> r+2 (given by their sources) ------------------------
dist = comm.Create_dist_graph([r], [2], [(r + 1) % n, (r + 2) % n], [7, 8])
w_send = np.array([10 * r + 1, 10 * r + 2], "i")
w_recv = np.full(2, -1, "i")
dist.Neighbor_alltoallw([w_send, [1, 1], [0, 4], [MPI.INT, MPI.INT]], [w_recv, [1, 1], [0, 4], [MPI.INT, MPI.INT]])
adj = comm.Create_dist_graph_adjacent([(r - 1) % n], [(r + 1) % n])
req = adj.Neighbor_alltoallv_init([np.array([r, r], "i"), [2], [0], MPI.INT], [w := np.zeros(2, "i"), [2], [0], MPI.INT])
req.Start()
req.Wait()
out["dist"] = [dist.Get_dist_neighbors(), dist.Get_dist_neighbors_count(), w_recv.tolist(), adj.inoutedges,
               w.tolist()]
for c in (cart, sub, graph, dist, adj):
    c.Free()
print("RESULT " + json.dumps(out), flush=True)
