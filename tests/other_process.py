"""Acting from another process, as a user's web app or script does."""

from __future__ import annotations

import subprocess
import sys


def enqueue_from_another_process(url: str, tenant: str, job_type: str = "job") -> None:
    """Enqueue ``{'from': 'elsewhere'}`` for app ``a`` through a Quick of a new process."""
    code = (
        "import sys; from quickzones.client import Quick\n"
        "q = Quick.open(sys.argv[1])\n"
        "q.enqueue(sys.argv[3], {'from': 'elsewhere'}, app='a', tenant=sys.argv[2])\n"
        "q.close()\n"
    )
    subprocess.run([sys.executable, "-c", code, url, tenant, job_type], check=True, timeout=60)
