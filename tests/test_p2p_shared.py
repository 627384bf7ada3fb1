"""Large messages within a host copied by both sides at once (gc_p2p.h's shared copy: the receiver
reads chunks with process_vm_readv while the sender writes others with process_vm_writev), in real
gpurun jobs (tests/scripts/p2p_shared.py)."""
import pytest

SIZES = [256 << 10, (256 << 10) + 1, (3 << 20) + 17, (40 << 20) + 5, 8 << 20]  # as the rank script
OBJECT_BYTES = 5 << 20                                                         # its object's array


def run(gpurun_job, mode, share=True, timeout="20"):
    env = {"GPUCOLL_TIMEOUT": timeout, "GPUCOLL_P2P_SHARED_COPY": "1" if share else "0"}
    return gpurun_job(2, "p2p_shared.py", mode, env=env, timeout=90)


def moved(res, rank):
    return res[rank]["read"] + res[rank]["written"]


@pytest.mark.parametrize("share", [True, False], ids=["shared", "receiver-alone"])
def test_a_window_of_large_messages_arrives_whole_and_both_sides_copy(gpurun_job, share):
    """Isend, Issend, Mprobe + Mrecv and an object, sizes of one chunk, one byte more, and not a
    multiple of a chunk: every byte arrives; the sender wrote part of them (and none with
    GPUCOLL_P2P_SHARED_COPY=0); between them the two sides copied each byte once."""
    res = run(gpurun_job, "window", share).check().json_lines()
    assert res[1]["whole"] == [True] * (len(SIZES) + 1), res
    assert res[0]["read"] == 0 and res[1]["written"] == 0, res  # one direction only
    total = moved(res, 0) + moved(res, 1)
    assert sum(SIZES) + OBJECT_BYTES <= total < sum(SIZES) + OBJECT_BYTES + 4096, res  # + the pickle's header
    if share:
        assert res[0]["written"] > 0 and res[1]["read"] > 0, res
    else:
        assert res[0]["written"] == 0, res


def test_both_directions_at_once_arrive_whole_each_byte_copied_once(gpurun_job):
    """Each rank sends a window and receives one at once (each rank reads its own receives first
    and helps with its sends only when it has none left to read): every byte arrives, and in each
    direction the receiver's reads and the sender's writes add up to the window, no byte twice."""
    res = run(gpurun_job, "both-ways").check().json_lines()
    window = sum(SIZES) + OBJECT_BYTES
    for rank in (0, 1):
        assert res[rank]["whole"] == [True] * (len(SIZES) + 1), res
        assert window <= res[rank]["read"] + res[1 - rank]["written"] < window + 4096, res


def test_a_sender_that_never_waits_leaves_the_receiver_to_copy_alone(gpurun_job):
    """Rank 0 starts an Isend and sleeps 3 s without a gpucoll call: rank 1's Recv claims every
    chunk and returns long before rank 0 wakes; rank 0 wrote nothing."""
    res = run(gpurun_job, "lazy-sender").check().json_lines()
    assert res[1]["whole"] is True and res[1]["seconds"] < 2, res
    assert res[1]["read"] == 64 << 20 and res[0]["written"] == 0, res


@pytest.mark.parametrize("mode", ["sender-dies", "receiver-dies"])
def test_a_peer_that_dies_mid_copy_fails_the_survivor_naming_it(gpurun_job, mode):
    """Rank 1 has read part of a 256 MiB message when one of the two ends: the survivor's wait
    (reading chunks, or writing its own into the dead receiver) raises LostPeerError naming the
    peer, promptly."""
    survivor = 1 if mode == "sender-dies" else 0
    job = run(gpurun_job, mode, timeout="30")
    res = job.json_lines()
    if mode == "sender-dies":
        assert res[1]["partly"] is True, res  # the copy was under way, not finished
    got = res[survivor]
    assert got["error"] is not None and got["error"]["type"] == "LostPeerError", job.describe()
    assert f"rank {1 - survivor}" in got["error"]["message"], got
    assert got["seconds"] < 10, got
