"""wrk with a Lua script that alternates acquire and release (P1, and wrk's own ceiling).

Each connection's next request releases a lease granted earlier (any
connection's, newest first) when one is waiting, else acquires one; so about
half the requests are `POST /v1/leases` and half `DELETE /v1/leases/{id}`, and
at most as many leases are held as there are connections. wrk's latency is
per request, measured in C: it is the server's plus the kernel's, not a
Python client's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import attrs

LEASE_BODY = '{"selector":{"bench":"true"},"target":"example.org","ttlSeconds":60}'

LUA = r"""
local token = ""
local ids = {}
local body = '%(body)s'
init = function(args)
  token = args[1] or ""
end
request = function()
  local headers = {["Content-Type"] = "application/json",
                   ["Authorization"] = "Bearer " .. token}
  local id = table.remove(ids)
  if id then
    return wrk.format("DELETE", "/v1/leases/" .. id, headers, nil)
  end
  return wrk.format("POST", "/v1/leases", headers, body)
end
response = function(status, headers, resp)
  if status == 201 then
    local id = string.match(resp, '"leaseId":"([^"]+)"')
    if id then table.insert(ids, id) end
  end
end
done = function(summary, latency, requests)
  io.write(string.format(
    'BENCH {"requests":%%d,"duration_us":%%d,"status_errors":%%d,"connect_errors":%%d,' ..
    '"read_errors":%%d,"write_errors":%%d,"timeouts":%%d,"p50_us":%%d,"p99_us":%%d,' ..
    '"max_us":%%d}\n',
    summary.requests, summary.duration, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


@attrs.frozen
class WrkResult:
    requests: int
    seconds: float
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def row(self) -> dict[str, float]:
        return {"req_s": round(self.rate, 1), "p50_ms": round(self.p50_ms, 2),
                "p99_ms": round(self.p99_ms, 2), "max_ms": round(self.max_ms, 2),
                "errors": self.errors, "requests": self.requests}


def write_script(directory: Path) -> Path:
    path = directory / "lease.lua"
    path.write_text(LUA % {"body": LEASE_BODY})
    return path


def wrk_command(url: str, *, script: Path, connections: int, seconds: float, token: str,
                core: int | None) -> list[str]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed (scripts/bench installs it: apt-get install wrk)")
    command = [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout",
               "10s", "-s", str(script), url, "--", token]
    if core is not None and shutil.which("taskset"):
        command = ["taskset", "-c", str(core), *command]
    return command


def parse(output: str) -> WrkResult:
    for line in output.splitlines():
        if line.startswith("BENCH "):
            raw = json.loads(line[len("BENCH "):])
            errors = sum(raw[k] for k in ("status_errors", "connect_errors", "read_errors",
                                          "write_errors", "timeouts"))
            return WrkResult(requests=raw["requests"], seconds=raw["duration_us"] / 1e6,
                             errors=errors, p50_ms=raw["p50_us"] / 1000,
                             p99_ms=raw["p99_us"] / 1000, max_ms=raw["max_us"] / 1000)
    raise RuntimeError(f"wrk printed no result:\n{output}")


def run_wrk(url: str, *, script: Path, connections: int, seconds: float, token: str,
            core: int | None) -> WrkResult:
    """Blocking: run wrk for `seconds` (call it in a thread)."""
    done = subprocess.run(wrk_command(url, script=script, connections=connections,
                                      seconds=seconds, token=token, core=core),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    return parse(done.stdout)
