"""What gpurun tells the user when a job does not end well, and the exit code it returns.

Exit-code policy (also in `gpurun --help`):

    0         every rank exited 0
    N         the first rank to fail exited with code N
    128+S     the first rank to fail was killed by signal S (SIGKILL: 137, SIGSEGV: 139)
    124       --timeout expired
    128+S     gpurun itself got SIGINT (130), SIGTERM (143) or SIGHUP (129)
    126, 127  the program could not be run / was not found
    2         bad command line
"""
from .signals import name as signal_name

EXIT_TIMEOUT = 124
TAIL_LINES = 20


def how_it_ended(returncode):
    """'exit code 3' or 'signal SIGKILL (9)' from a Popen return code."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"signal {signal_name(-returncode)} ({-returncode})"
    return f"exit code {returncode}"


def exit_code_of(returncode):
    """gpurun's exit code when the rank that failed first ended with `returncode`."""
    return 128 - returncode if returncode < 0 else returncode


def failure_report(rank, host, stderr_tail, stopped, exit_code):
    """The lines printed when rank `rank` failed first. `stopped` lists the ranks that
    gpurun had to stop because of it."""
    lines = [f"gpurun: rank {rank.rank} (host {host}, pid {rank.pid}) failed first: "
             f"{how_it_ended(rank.returncode)}"]
    if stderr_tail:
        lines.append(f"gpurun: last {len(stderr_tail)} lines of rank {rank.rank}'s stderr:")
        lines.extend(f"    {line}" for line in stderr_tail)
    else:
        lines.append(f"gpurun: rank {rank.rank} wrote nothing to stderr")
    if stopped:
        lines.append(f"gpurun: stopped {len(stopped)} other rank(s): {ranks_text(stopped)}")
    lines.append(f"gpurun: exiting with {exit_code}")
    return lines


def timeout_report(timeout, still_running):
    """The lines printed when --timeout ended the job."""
    return [f"gpurun: timeout: the job ran longer than {timeout:g} s; "
            f"ranks still running: {ranks_text(still_running)}",
            f"gpurun: stopped them; exiting with {EXIT_TIMEOUT}"]


def signal_report(signum, still_running):
    """The lines printed when a signal to gpurun ended the job."""
    return [f"gpurun: got {signal_name(signum)}; forwarded it to every rank and ended the job "
            f"(ranks still running then: {ranks_text(still_running)}); exiting with {128 + signum}"]


def launcher_stop(reason, signum, timeout, still_running):
    """(exit code, report lines) when gpurun itself ended the job (a signal it received or
    --timeout), else None: the ranks' own outcome decides."""
    if reason == "signal":
        return 128 + signum, signal_report(signum, still_running)
    if reason == "timeout":
        return EXIT_TIMEOUT, timeout_report(timeout, still_running)
    return None


def ranks_text(ranks):
    """'0, 2, 3' (or 'none')."""
    return ", ".join(str(r) for r in sorted(ranks)) or "none"
