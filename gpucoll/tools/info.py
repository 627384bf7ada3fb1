"""The `gpucoll` command: `gpucoll info` shows settings, GPUs and the transports in use;
`gpucoll environment` prints docs/environment.md."""
import os
import socket

import click

from ..base import config


@click.group()
def main():
    """gpucoll utilities."""


@main.command()
def info():
    """Print every GPUCOLL_* variable with its value, this host's GPUs and links,
    and the transports and algorithms gpucoll would choose."""
    from ..transports import gpu_topology as topology

    click.echo(f"gpucoll {__import__('gpucoll').__version__} on {socket.gethostname()}")
    click.echo("\nVariables (value; default; meaning):")
    for var in config.ALL:
        try:
            value = var.get()
            shown = "(unset)" if not var.is_set() else var.shown(value)
        except config.ConfigError as exc:
            shown = f"INVALID: {exc}"
        set_by = " (set by gpurun)" if var.launcher else ""
        click.echo(f"  {var.name:24s} {shown:14s} default {var.default!r}; {var.help}{set_by}")
    for name in config.undeclared():
        click.echo(f"  {name:24s} UNKNOWN: nothing reads this variable (a typo?)")
    click.echo("\nGPUs:")
    for line in topology.describe():
        click.echo(f"  {line}")
    click.echo("\nTransports:")
    click.echo(f"  same host, host buffers : {'sockets (GPUCOLL_SHM_DISABLE=1)' if config.SHM_DISABLE.get() else 'shared memory'}")
    try:
        from ..transports import net

        between = net.between_hosts()
        how = "TCP sockets" if between.name == "tcp" else f"OFI, provider {between.provider}"
        click.echo(f"  between hosts           : {how} ({between.why})")
        if between.name == "ofi":
            ofi = net.ofi_module()
            for prov, fabric, domain, hmem in ofi.interfaces(between.provider):
                click.echo(f"    {prov} fabric {fabric} domain {domain}: GPU memory "
                           f"{'registered directly (FI_HMEM)' if hmem else 'staged through host memory'}")
    except Exception as exc:  # shown, not raised: info must always print
        click.echo(f"  between hosts           : {exc}")
    try:
        from ..transports import ifaces

        chosen = ifaces.select_interface()
        click.echo(f"  socket interface        : {chosen.describe()} (between hosts; a one-host job listens on "
                   f"{'it' if config.SOCKET_IFNAME.get() else 'loopback'})")
    except Exception as exc:  # shown, not raised: info must always print
        click.echo(f"  socket interface        : {exc}")
    try:
        from ..algorithms import selector

        click.echo("\nAlgorithm cost table:")
        for line in selector.describe():
            click.echo(f"  {line}")
    except ImportError:
        pass


@main.command()
def environment():
    """Print docs/environment.md: every GPUCOLL_* variable with its type, default, accepted values
    and meaning (Markdown, made from gpucoll/base/config.py's declarations)."""
    from .envdoc import page

    click.echo(page(), nl=False)


if __name__ == "__main__":
    main()
