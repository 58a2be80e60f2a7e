"""One Python per test binary that has imported torch and torchvision once, forking a child for each reference
script a test runs (rn50_util::testing::python_output). `import torch, torchvision` alone costs about 6 CPU-seconds
on the 2-core CI machine, more than most reference scripts spend on their work, and a test run starts about 100 of
them.

    python python_forkserver.py SOCKET

Prints "ready" once it listens on the Unix socket SOCKET, and ends when its stdin closes (the test binary exited),
removing SOCKET's folder.
A request is one connection: NUL-terminated fields (the working directory, the files for stdout and stderr, the
number of environment entries, those KEY=VALUE entries, then the command line after `python`: `SCRIPT ARGS...`,
`-c CODE ARGS...` or `-m MODULE ARGS...`), then the end of what the client writes. The reply is the child's wait
status in decimal, as waitpid(2) gives it. A child starts as a fresh `python` would: that command line, that
directory and environment, stdin /dev/null, the random module's, NumPy's and torch's global generators seeded from
the OS (as a fresh `import torch` seeds its own); its atexit handlers and non-daemon threads end with it.
"""
import os
import select
import shutil
import socket
import sys

# Imported here, once: what the reference scripts import (any other module they import loads in the child).
import numpy
import PIL.Image  # noqa: F401
import torch
import torchvision  # noqa: F401
import torchvision.transforms.v2  # noqa: F401


def run(fields):
    """The child: becomes `python ARGV...` in the request's directory and environment, and never returns."""
    cwd, out, err, n_env = fields[:4]
    n_env = int(n_env)
    env = dict(kv.split("=", 1) for kv in fields[4 : 4 + n_env])
    argv = fields[4 + n_env :]
    code = 1
    try:
        os.chdir(cwd)
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            f = os.open(path, flags, 0o644)
            os.dup2(f, fd)
            os.close(f)
        os.environ.clear()
        os.environ.update(env)
        import random

        random.seed()
        numpy.random.seed()
        torch.seed()
        import runpy

        if argv[0] == "-c":
            sys.argv = ["-c"] + argv[2:]
            sys.path[0] = ""
            import types

            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            import atexit
            import threading

            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def serve(conn):
    """A child per connection: forks the script's process, waits for it, and replies with its wait status."""
    data = b""
    while chunk := conn.recv(1 << 16):
        data += chunk
    fields = [f.decode("utf-8", "surrogateescape") for f in data.split(b"\0")[:-1]]
    pid = os.fork()
    if pid == 0:
        conn.close()
        run(fields)
    _, status = os.waitpid(pid, 0)
    conn.sendall(str(status).encode())


def main():
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[1])
    listener.listen(64)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [], 1.0)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            break
        if listener in ready:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                try:
                    serve(conn)
                finally:
                    os._exit(0)
            conn.close()
        # The connections' children that ended.
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
    shutil.rmtree(os.path.dirname(sys.argv[1]), ignore_errors=True)


main()
