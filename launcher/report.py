"""What gpurun tells the user when a job does not end well, and the exit code it returns.

Exit-code policy (also in `gpurun --help`):

    0         every rank exited 0
    N         the first rank to fail exited with code N
    128+S     the first rank to fail was killed by signal S (SIGKILL: 137, SIGSEGV: 139)
    124       --timeout expired
    128+S     gpurun itself got SIGINT (130), SIGTERM (143) or SIGHUP (129)
    125       gpurun could not set the job up (no free port for its store), or a host
              was lost / its agent could not start
    126, 127  the program could not be run / was not found
    2         bad command line
"""
import os
import re

import gpucoll  # cheap: names inside it load on first use

from .signals import name as signal_name

EXIT_USAGE = 2            # a bad command line
EXIT_TIMEOUT = 124
EXIT_SETUP = 125          # gpurun could not set the job up (no free port, a lost host...)
EXIT_CANNOT_RUN = 126     # PROGRAM exists but cannot be run
EXIT_NOT_FOUND = 127      # PROGRAM (or the interpreter its #! line names) does not exist
EXIT_PRELOAD = 1          # a --preload module cannot be imported (as a program whose import fails)
#: Lines of a rank's stderr kept for the report (output.RankStream clips each line).
KEPT_LINES = 200
#: Lines shown when the kept stderr holds no traceback.
TAIL_LINES = 20
#: At most this many lines of the user's frames, and of the exception's message, are shown.
SHOWN_FRAME_LINES = 30
SHOWN_MESSAGE_LINES = 12

_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line \d+, in (?P<func>.*)$')
_GPUCOLL_DIR = os.path.dirname(os.path.abspath(gpucoll.__file__)) + os.sep


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


def failure_report(rank, host, pid, returncode, stderr_lines, stopped, exit_code):
    """The lines printed when rank `rank` failed first: how it ended, its traceback (or the
    last lines of its stderr), and the ranks that gpurun had to stop because of it."""
    lines = [f"gpurun: rank {rank} (host {host}, pid {pid}) failed first: {how_it_ended(returncode)}"]
    traceback, hidden = user_traceback(stderr_lines)
    if traceback:
        left_out = f"; {hidden} frame(s) inside gpucoll left out" if hidden else ""
        lines.append(f"gpurun: rank {rank}'s traceback (the last in its stderr{left_out}):")
        lines.extend(f"    {line}" for line in traceback)
    elif stderr_lines:
        tail = stderr_lines[-TAIL_LINES:]
        lines.append(f"gpurun: last {len(tail)} lines of rank {rank}'s stderr:")
        lines.extend(f"    {line}" for line in tail)
    else:
        lines.append(f"gpurun: rank {rank} wrote nothing to stderr")
    if stopped:
        lines.append(f"gpurun: stopped {len(stopped)} other rank(s): {ranks_text(stopped)}")
    lines.append(f"gpurun: exiting with {exit_code}")
    return lines


def user_traceback(lines):
    """The last Python traceback in `lines` with the frames inside gpucoll left out, so that
    the user's own file and line show however deep gpucoll's part of it was, and the number
    of frames left out; ([], 0) when there is no traceback. Bounded: at most
    SHOWN_FRAME_LINES lines of frames and SHOWN_MESSAGE_LINES of the exception."""
    starts = [i for i, line in enumerate(lines) if line.rstrip() == _TRACEBACK]
    if not starts:
        return [], 0
    block = lines[starts[-1] + 1:]
    frames, i = [], 0
    while i < len(block) and _FRAME.match(block[i]):
        end = i + 1
        # Source, position markers and "[Previous line repeated N more times]" lines.
        while end < len(block) and (block[end].startswith("    ") or block[end].startswith("  [")):
            end += 1
        frames.append(block[i:end])
        i = end
    shown, hidden, run = [], 0, 0
    for frame in frames:
        if _inside_gpucoll(frame[0]):
            hidden, run = hidden + 1, run + 1
            continue
        if run:
            shown.append(f"  ... {run} frame(s) inside gpucoll ...")
            run = 0
        shown.extend(frame)
    if run:
        shown.append(f"  ... {run} frame(s) inside gpucoll ...")
    message = block[i:]
    return [_TRACEBACK] + _bounded(shown, SHOWN_FRAME_LINES) + _bounded(message, SHOWN_MESSAGE_LINES), hidden


def _inside_gpucoll(frame_line):
    m = _FRAME.match(frame_line)
    path, func = m.group("file"), m.group("func")
    return (path.startswith(_GPUCOLL_DIR) or func.startswith("gpucoll.")
            or any(f"{os.sep}{d}{os.sep}gpucoll{os.sep}" in path for d in ("site-packages", "dist-packages")))


def _bounded(lines, most):
    """`lines`, or their first and last parts around a line that counts the rest."""
    if len(lines) <= most:
        return list(lines)
    head, tail = most // 3, most - most // 3 - 1
    return lines[:head] + [f"  ... {len(lines) - head - tail} more line(s) ..."] + lines[-tail:]


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


def end_of_job(reason, signum, timeout, still_running, first_failure):
    """(exit code, report lines) of a job that gpurun ended (launcher_stop) or that a rank's
    failure ended (first_failure: rank, host, pid, returncode, stderr tail of the first rank
    that failed; the ranks still running are reported as stopped), else None: every rank
    ended by itself, well. The one closing report of a one-host job and of a multi-host one."""
    stopped_by_us = launcher_stop(reason, signum, timeout, still_running)
    if stopped_by_us is not None:
        return stopped_by_us
    if first_failure is None:
        return None
    rank, host, pid, returncode, tail = first_failure
    code = exit_code_of(returncode)
    stopped = [r for r in still_running if r != rank]
    return code, failure_report(rank, host, pid, returncode, tail or [], stopped, code)


def ranks_text(ranks):
    """'0, 2, 3' (or 'none')."""
    return ", ".join(str(r) for r in sorted(ranks)) or "none"
