"""The application the BOINC client runs for every gridbot job: one POSIX sh script, signed by the server.

The client copies the job's files into its slot (`<copy_file/>`): `gridbot_job`, a shell fragment the server
wrote for this instance (its command, environment, limits, timeout and declared outputs), and
`gridbot_in_K`, the bag's inputs. The script stages the inputs under their names in `gridbot_work/`, runs the
command there under `/bin/sh -c` with its own stdout and stderr, and writes `gridbot_result` (read by
`jobs.read_result`), which the client uploads:

    gridbot-result 1
    status CODE                     the command's exit status (128+N: killed by signal N)
    timeout SECONDS                 only if the wrapper killed it at the bag's timeout
    file stdout SIZE\\n<SIZE bytes>\\n  the last 64 KiB of its stdout, then of its stderr
    file stderr SIZE\\n<SIZE bytes>\\n
    file K SIZE\\n<SIZE bytes>\\n       declared output number K (its name is the server's)
    missing K                       declared output K was not produced
    end

For the quorum's tests only, a client started with `GRIDBOT_WRAPPER_CORRUPT_OUTPUTS=1` in its environment (the
client passes it on to its tasks) appends a line to every output: a volunteer returning wrong results.

It then writes `boinc_finish_called` and exits 0 whatever the job did: a job's failure travels in the result
(a non-zero exit would put the client into a project-wide backoff). Plain sh, printf, wc, tail, cat, cp,
mkdir, ps, awk, od and dd: nothing a Linux, macOS or BSD host lacks. At the bag's timeout it kills the job's
whole process tree (found through `ps`, frozen first).

It honours the client's suspend and resume (the volunteer pausing BOINC, or the client making room for another
project, or its CPU throttle): the client puts `<suspend/>` and `<resume/>` into the first channel of the shared
memory it maps for every task, the file `boinc_mmap_file` in the slot (BOINC's API, `MSG_CHANNEL`: a flag byte,
1 while a message waits, then the message up to a NUL; the reader clears the flag). Once a second the wrapper reads that
byte, takes the message, clears the flag, and stops (SIGSTOP) or continues (SIGCONT) the job's process tree. The
bag's timeout counts the seconds the job ran, not those it was suspended. The client still kills the task and its
children when it quits or aborts it.
"""

from __future__ import annotations

WRAPPER_VERSION = 103
"""The app version the client sees; a change of the script needs a new one (clients keep what they fetched)."""
APP_NAME = "gridbot"
WRAPPER_NAME = f"gridbot_wrapper_{WRAPPER_VERSION}.sh"
TAIL_BYTES = 64 * 1024

SCRIPT = r"""#!/bin/sh
# gridbot's BOINC application: runs one gridbot job in this slot (docs/volunteers.md).
slot=$(pwd)
work="$slot/gridbot_work"
result="$slot/gridbot_result"
part="$slot/gridbot_result.part"

finish() {
    printf 'end\n' >> "$part"
    mv -f "$part" "$result"
    printf '0\n' > "$slot/boinc_finish_called"
    exit 0
}

put() {  # put LABEL FILE: one framed file of the result, its last TAIL bytes only
    if [ -f "$2" ]; then
        tail -c TAIL "$2" > "$slot/gridbot_piece" 2>/dev/null || cp "$2" "$slot/gridbot_piece"
        size=$(wc -c < "$slot/gridbot_piece" | tr -d ' ')
        printf 'file %s %s\n' "$1" "$size" >> "$part"
        cat "$slot/gridbot_piece" >> "$part"
        printf '\n' >> "$part"
        rm -f "$slot/gridbot_piece"
    fi
}

whole() {  # whole LABEL FILE: one framed file of the result, whole
    size=$(wc -c < "$2" | tr -d ' ')
    printf 'file %s %s\n' "$1" "$size" >> "$part"
    cat "$2" >> "$part"
    printf '\n' >> "$part"
}

tree() {  # tree PID: PID and its descendants, parents first
    echo "$1"
    for child in $(ps -A -o pid= -o ppid= 2>/dev/null | awk -v p="$1" '$2 == p { print $1 }'); do
        tree "$child"
    done
}

stop_job() {  # stop_job SIGNAL PIDS: the job's processes, frozen first so none forks away
    kill -STOP $2 2>/dev/null
    kill -"$1" $2 2>/dev/null
    kill -CONT $2 2>/dev/null
}

monitor() {  # monitor JOB: every second, the client's suspend and resume, and the timeout in seconds run
    mmap="$slot/boinc_mmap_file"
    ran=0
    held=0
    while kill -0 "$1" 2>/dev/null; do
        sleep 1
        if [ -f "$mmap" ] && [ "$(od -A n -t u1 -N 1 "$mmap" 2>/dev/null | tr -d ' ')" = 1 ]; then
            msg=$(dd if="$mmap" bs=1 skip=1 count=64 2>/dev/null | tr '\000' '\n' | head -n 1)
            printf '\000' | dd of="$mmap" bs=1 count=1 conv=notrunc 2>/dev/null
            case "$msg" in
                *'<suspend/>'*) held=1; kill -STOP $(tree "$1") 2>/dev/null ;;
                *'<resume/>'*) held=0; kill -CONT $(tree "$1") 2>/dev/null ;;
            esac
        fi
        if [ "$held" = 0 ]; then
            ran=$((ran + 1))
        fi
        if [ "$gridbot_timeout" -gt 0 ] && [ "$ran" -ge "$gridbot_timeout" ]; then
            : > "$slot/gridbot_timed_out"
            pids=$(tree "$1")
            stop_job TERM "$pids"
            sleep 5
            stop_job KILL "$pids"
            return
        fi
    done
}

printf 'gridbot-result 1\n' > "$part"
if [ ! -f "$slot/gridbot_job" ]; then
    printf 'status 127\n' >> "$part"
    printf 'gridbot wrapper: no gridbot_job in the slot\n' > "$slot/gridbot_stderr"
    put stderr "$slot/gridbot_stderr"
    finish
fi
gridbot_timeout=0
gridbot_noutputs=0
. "$slot/gridbot_job"
rm -rf "$work"
mkdir -p "$work"
cd "$work" || exit 0
gridbot_stage

rm -f "$slot/gridbot_timed_out"
( gridbot_env; gridbot_limits; exec /bin/sh -c "$gridbot_command" ) \
    > "$slot/gridbot_stdout" 2> "$slot/gridbot_stderr" < /dev/null &
job=$!
monitor "$job" > /dev/null 2>&1 &
watchdog=$!
wait "$job"
code=$?
stop_job KILL "$(tree "$watchdog")"
cd "$slot" || exit 0
printf 'status %s\n' "$code" >> "$part"
if [ -f "$slot/gridbot_timed_out" ]; then
    printf 'timeout %s\n' "$gridbot_timeout" >> "$part"
fi
put stdout "$slot/gridbot_stdout"
put stderr "$slot/gridbot_stderr"
k=0
while [ "$k" -lt "$gridbot_noutputs" ]; do
    eval "name=\$gridbot_output_$k"
    if [ -n "$GRIDBOT_WRAPPER_CORRUPT_OUTPUTS" ] && [ -f "$work/$name" ]; then
        printf 'corrupted by a test\n' >> "$work/$name"  # tests of the quorum only (see the module)
    fi
    if [ -f "$work/$name" ] && [ ! -L "$work/$name" ]; then
        whole "$k" "$work/$name"
    else
        printf 'missing %s\n' "$k" >> "$part"
    fi
    k=$((k + 1))
done
finish
""".replace("TAIL", str(TAIL_BYTES))
"""The script itself (served and signed as WRAPPER_NAME)."""

WRAPPER_BYTES = SCRIPT.encode()
