import os, socket, subprocess, sys, time, shutil, tempfile
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import redis as _redis

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

class Redis:
    def __init__(self, d, port=None):
        self.port = port or free_port(); self.dir = d; self.proc = None
        self.url = f"redis://127.0.0.1:{self.port}/0"
    def start(self):
        self.proc = subprocess.Popen(["/usr/bin/redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "3600 1", "--appendonly", "no", "--dir", self.dir],
            stdout=open(os.path.join(self.dir, "redis.log"), "ab"), stderr=subprocess.STDOUT)
        c = _redis.Redis(port=self.port)
        for _ in range(500):
            try:
                c.ping(); return
            except Exception: time.sleep(0.02)
        raise RuntimeError("redis did not start")
    def shutdown_save(self):
        """A graceful restart of a Redis that persists (SHUTDOWN SAVE writes dump.rdb)."""
        self.proc.terminate()   # redis-server saves dump.rdb on SIGTERM when save points are set
        self.proc.wait(10)
    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill(); self.proc.wait(10)

def pause(rd):
    import signal; rd.proc.send_signal(signal.SIGSTOP)
def resume(rd):
    import signal; rd.proc.send_signal(signal.SIGCONT)
