#!/usr/bin/env bash
# What the native build needs beyond PyPI (`make install` runs this first): libfabric's headers
# (Debian's libfabric-dev, with libfabric-bin's fi_info), for the OFI transport between hosts.
# Without them gpucoll builds without that transport (TCP between hosts); as root where apt
# exists this installs them. Idempotent; never fails the install.
say() { echo "setup-build-deps: $*"; }
for d in ${CPATH//:/ } ${C_INCLUDE_PATH//:/ } /usr/include /usr/local/include /opt/libfabric/include; do
    [ -f "$d/rdma/fabric.h" ] && exit 0
done
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "libfabric's headers are absent and this is not root with apt: building without the OFI transport"
    exit 0
fi
say "installing libfabric-dev libfabric-bin (the OFI transport)"
export DEBIAN_FRONTEND=noninteractive
{ apt-get install -y -q libfabric-dev libfabric-bin >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null && apt-get install -y -q libfabric-dev libfabric-bin >/dev/null; }; } \
  || say "apt-get install libfabric-dev failed: building without the OFI transport"
exit 0
