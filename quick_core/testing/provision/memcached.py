"""A throwaway memcached: :class:`MemcachedServer` (a ``memcached`` process) and
:func:`provide_memcached` (whatever can be had here)."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager

from quickzones.testing.provision.ports import HOST
from quickzones.testing.provision.process import Service, TLSFiles, provide_server


class MemcachedServer(Service):
    """``memcached`` with a small cache and UDP off."""

    binary_name, service_name, image = "memcached", "memcached", "memcached:1.6-alpine"
    default_port, env_var = 11211, "QUICK_MEMCACHED_URL"
    probe, expect = b"version\r\n", b"VERSION"

    @classmethod
    def url_for(cls, host: str, port: int, tls: TLSFiles | None = None) -> str:
        query = "" if tls is None else f"?tls_ca_certs={tls.ca}"
        return f"memcached://{host}:{port}{query}"

    def argv(self) -> list[str]:
        argv = [self.binary, "-l", HOST, "-p", str(self.port), "-U", "0", "-m", "16"]
        if self.tls is not None:
            argv += ["-Z", "-o", f"ssl_chain_cert={self.tls.cert},ssl_key={self.tls.key}"]
        if os.geteuid() == 0:
            argv += ["-u", "root"]  # memcached refuses to run as root unless told to
        return argv


def provide_memcached() -> AbstractContextManager[str]:
    """A ``memcached://`` URL: a container, ``QUICK_MEMCACHED_URL``, a throwaway
    ``memcached``, or a memcached on 127.0.0.1:11211; else :class:`ServiceUnavailable`
    naming what was tried."""
    return provide_server(MemcachedServer)
