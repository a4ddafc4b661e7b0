"""A throwaway Redis: :class:`RedisServer` (a ``redis-server`` process) and
:func:`provide_redis` (whatever can be had here)."""

from __future__ import annotations

from contextlib import AbstractContextManager

from quickzones.testing.provision.ports import HOST
from quickzones.testing.provision.process import Service, TLSFiles, provide_server


class RedisServer(Service):
    """``redis-server`` with persistence off, so a restart starts empty."""

    binary_name, service_name, image = "redis-server", "redis", "redis:7-alpine"
    default_port, env_var = 6379, "QUICK_REDIS_URL"
    probe, expect = b"PING\r\n", b"+PONG"

    @classmethod
    def url_for(cls, host: str, port: int, tls: TLSFiles | None = None) -> str:
        if tls is None:
            return f"redis://{host}:{port}/0"
        return f"rediss://{host}:{port}/0?ssl_ca_certs={tls.ca}"

    def argv(self) -> list[str]:
        listen = ["--port", str(self.port)]
        if self.tls is not None:
            tls = self.tls
            listen = ["--port", "0", "--tls-port", str(self.port),
                      "--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key),
                      "--tls-ca-cert-file", str(tls.ca), "--tls-auth-clients", "no"]  # fmt: skip
        quiet = ["--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]
        return [self.binary, *listen, "--bind", HOST, *quiet, "--dir", str(self.workdir)]


def provide_redis() -> AbstractContextManager[str]:
    """A ``redis://`` URL: a container, ``QUICK_REDIS_URL``, a throwaway ``redis-server``,
    or a Redis on 127.0.0.1:6379; else :class:`ServiceUnavailable` naming what was tried."""
    return provide_server(RedisServer)
