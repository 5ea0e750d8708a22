"""RedisLoadStore: the LoadStore shared by every router replica, in a real Redis server.

Keys (namespaced per deployment, all with TTLs so dead replicas age out):
  {prefix}:win:{bucket}  hash of additive sums for one time bucket (HINCRBYFLOAT), TTL ≈ window
  {prefix}:cost:{bucket} the deployment's sums alone (the round cost model's and acceptance's:
                         `StatsWindow.deployment`), in coarser buckets, TTL ≈ cost window;
                         routers that predate acceptance there add none (their drafts count
                         once they are upgraded)
  {prefix}:replicas      hash replica id -> "in_flight queued at"; stale entries are ignored
  {prefix}:switch        hash {enabled, since}: the shared load switch (compare-and-set)
  {prefix}:push:{id}     marks a push as applied (TTL ≈ window): a retried push is a no-op
Writes are atomic Lua scripts; reads are one pipeline. Timeouts are short (≤ 50 ms): the
LoadMonitor calls this from a background thread and falls back to local measurements.
"""

from __future__ import annotations

import redis

from specdec.policy.load_stats import LoadSnapshot, StatsWindow
from specdec.policy.load_store import LoadStore, SwitchState, cost_window
from specdec.policy.window_ring import bucket_start

# KEYS: window bucket, replicas, push marker ('' = none), cost bucket. ARGV: window TTL,
# replica id, its gauge, replicas TTL, cost TTL, the number of window fields, then the window's
# (field, value) pairs, then the cost bucket's.
PUSH_SCRIPT = """
if KEYS[3] ~= '' and not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[1]) then
  return 0
end
local last = 6 + 2 * tonumber(ARGV[6])
for i = 7, last, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
if #ARGV > last then
  for i = last + 1, #ARGV, 2 do
    redis.call('HINCRBYFLOAT', KEYS[4], ARGV[i], ARGV[i + 1])
  end
  redis.call('EXPIRE', KEYS[4], ARGV[5])
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
"""

CAS_SCRIPT = """
local enabled = redis.call('HGET', KEYS[1], 'enabled') or '1'
local since = redis.call('HGET', KEYS[1], 'since') or '-inf'
if enabled ~= ARGV[1] or since ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'enabled', ARGV[3], 'since', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


def _encode_state(state: SwitchState) -> tuple[str, str]:
    return ("1" if state.enabled else "0", repr(float(state.since)))


class RedisLoadStore(LoadStore):
    def __init__(
        self,
        url: str,
        deployment: str = "default",
        window_s: float = 10.0,
        bucket_s: float = 1.0,
        replica_ttl_s: float = 5.0,
        switch_ttl_s: float = 3600.0,
        timeout_s: float = 0.05,
        password: str | None = None,
        cost_window_s: float | None = None,
    ) -> None:
        """cost_window_s: how long the round cost and acceptance sums are kept (None: window_s)."""
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, password=password,
            decode_responses=True, retry_on_timeout=False,
        )
        self.prefix = f"specdec:{deployment}"
        self.window_s, self.bucket_s = window_s, bucket_s
        self.cost_window_s, self.cost_bucket_s = cost_window(window_s, bucket_s, cost_window_s)
        self.replica_ttl_s, self.switch_ttl_s = replica_ttl_s, switch_ttl_s
        self._push = self.client.register_script(PUSH_SCRIPT)
        self._cas = self.client.register_script(CAS_SCRIPT)

    @property
    def num_buckets(self) -> int:
        return max(1, round(self.window_s / self.bucket_s))

    @property
    def num_cost_buckets(self) -> int:
        return max(1, round(self.cost_window_s / self.cost_bucket_s))

    def push(
        self, replica_id: str, delta: StatsWindow, at: float, in_flight: int, queued: int, push_id: str | None = None
    ) -> bool:
        key = f"{self.prefix}:win:{bucket_start(at, self.bucket_s)}"
        cost_key = f"{self.prefix}:cost:{bucket_start(at, self.cost_bucket_s)}"
        fields = [x for k, v in delta.sums.items() if v for x in (k, repr(float(v)))]
        costs = [x for k, v in delta.deployment().sums.items() if v for x in (k, repr(float(v)))]
        ttl = int(self.window_s + 2 * self.bucket_s) + 1
        cost_ttl = int(self.cost_window_s + 2 * self.cost_bucket_s) + 1
        gauge = f"{in_flight} {queued} {at!r}"
        marker = f"{self.prefix}:push:{push_id}" if push_id is not None else ""
        return bool(self._push(keys=[key, f"{self.prefix}:replicas", marker, cost_key],
                               args=[ttl, replica_id, gauge, int(self.replica_ttl_s * 4) + 1, cost_ttl,
                                     len(fields) // 2, *fields, *costs]))

    def snapshot(self, now: float) -> LoadSnapshot:
        pipe = self.client.pipeline(transaction=False)
        for name, bucket_s, count in (("win", self.bucket_s, self.num_buckets),
                                      ("cost", self.cost_bucket_s, self.num_cost_buckets)):
            newest = bucket_start(now, bucket_s)
            for bucket in range(newest - count + 1, newest + 1):
                pipe.hgetall(f"{self.prefix}:{name}:{bucket}")
        pipe.hgetall(f"{self.prefix}:replicas")
        *hashes, replicas = pipe.execute()
        total, costs = StatsWindow(), StatsWindow()
        for i, bucket in enumerate(hashes):
            (total if i < self.num_buckets else costs).merge({k: float(v) for k, v in bucket.items()})
        in_flight = queued = 0.0
        alive = 0
        for value in replicas.values():
            f, q, at = value.split()
            if now - float(at) <= self.replica_ttl_s:
                in_flight, queued, alive = in_flight + float(f), queued + float(q), alive + 1
        return LoadSnapshot.from_window(total, self.window_s, in_flight, queued, measured_at=now, deployment=costs,
                                        replicas=alive)

    def switch_state(self) -> SwitchState:
        raw = self.client.hgetall(f"{self.prefix}:switch")
        if not raw:
            return SwitchState()
        return SwitchState(enabled=raw.get("enabled", "1") == "1", since=float(raw.get("since", "-inf")))

    def compare_and_set_switch(self, expected: SwitchState, new: SwitchState) -> bool:
        args = [*_encode_state(expected), *_encode_state(new), int(self.switch_ttl_s)]
        return bool(self._cas(keys=[f"{self.prefix}:switch"], args=args))

    def close(self) -> None:
        self.client.close()
