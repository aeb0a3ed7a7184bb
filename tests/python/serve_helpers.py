"""Shared helpers of the `loom serve` tests and tools/bench_serve.py: a tiny trained checkpoint
and a running server (the real executable) with its address."""
import os
import re
import signal
import subprocess
import threading
import time

from test_data_helpers import ROOT, loom_binary

LISTENING = re.compile(r"listening on (http://[0-9.]+:\d+)")


class Server:
    """`loom serve` as a child process; `url` once it listens. Its stderr is kept in `log`."""

    def __init__(self, checkpoint, *flags, env=None, timeout=180):
        cmd = [str(loom_binary()), "serve", "--checkpoint", str(checkpoint), "--port", "0", *map(str, flags)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})}, start_new_session=True)
        self.log = []
        self.url = None
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                m = LISTENING.search(line)
                if m and not ready.is_set():
                    self.url = m.group(1)
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        ready.wait(timeout)
        if self.url is None:
            self.stop()
            raise RuntimeError("loom serve did not start:\n" + "".join(self.log)[-4000:])

    def ranks(self):
        """Process ids of the ranks: the server itself, or the launcher's children."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        return [int(p) for p in out] or [self.proc.pid]

    def rss_kib(self, pid=None):
        with open(f"/proc/{pid or self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def terminate(self, timeout=120):
        """SIGTERM, then the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.reader.join(5)
        return code

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def wait_exit(proc, timeout):
    """The exit status of `proc` within `timeout` seconds, else None."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return proc.returncode
        time.sleep(0.1)
    return None
