"""A server on loopback that answers every connection with a script: bytes, or a callable given the connection and
a stop Event (a trickle, a cut). Plain TCP, or TLS with a context. Hostile servers for the clients nodecheck has."""

from __future__ import annotations

import socket
import threading


class ScriptedServer:
    def __init__(self, reply, tls=None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.reply, self.tls, self.stop = reply, tls, threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                raw, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self.answer, args=(raw,), daemon=True).start()

    def answer(self, raw: socket.socket) -> None:
        try:
            with self.tls.wrap_socket(raw, server_side=True) if self.tls else raw as conn:
                conn.settimeout(5)
                conn.recv(65536)
                self.reply(conn, self.stop) if callable(self.reply) else conn.sendall(self.reply)
        except OSError:
            pass

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()
