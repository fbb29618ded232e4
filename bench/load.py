"""Open-loop Poisson load against difflet-runtime: one model process vs 2 replicas, or (with
--batching) one model process with batching off (--max-batch 1) vs on (--max-batch 4).

Both configurations get the same arrival sequence per load level (seeded exponential gaps).
Load rho = arrival rate x isolated latency, where the isolated latency is the median of
sequential requests on the one-process server (as in the paper's Table 8). Each request is a
Generate over one shared gRPC channel, sent at its arrival time whatever is still in flight
(open loop). Reports per configuration and level: realized load, p50/p99 latency (arrival ->
answer), SLO attainment (answer within 2.1x the isolated latency), and requests lost (any
answer that is not an image; must be 0 -- the queue is sized so nothing is refused).

    python bench/load.py [--n 20] [--steps 20] [--loads 0.5,0.8,1.0,1.2] [--art DIR | --store DIR]
                         [--http] [--batching [--out FILE.json]]

--batching builds flux-tiny with `--batch-sizes 1,2,4` and compares one model process with
--max-batch 1 and --max-batch 4 on the same arrivals (throughput = completed / makespan).

--http sends every request as an OpenAI `POST /v1/images/generations` (b64_json) to the
server's HTTP port instead of gRPC Generate (a fresh connection per request; same queue).

Note: by default the server gives each model process cpu_count // replicas torch threads;
--threads N fixes it for both configurations (so the comparison is replicas alone).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PROMPT = "a red fox in the snow"
SLO_FACTOR = 2.1


def build_artifacts(store: Path, batches: list[int] | None = None) -> Path:
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(REPO / "models" / "flux-tiny.dsl"), batches=batches),
                      parallel="tp1", target="cpu", backend="inductor")
    art = store / ("bench-load-batch-art" if batches else "bench-load-art") / module.name
    if not (art / "manifest.json").exists():
        codegen(module, "random:0", art, backend="inductor", store=store, log=lambda *a: None)
    return art


def arrivals(rate: float, n: int, seed: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class HttpFailed(Exception):
    """An HTTP answer that is not a PNG; `code` names it like a gRPC status name."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Target:
    """A running difflet-runtime and a stub on one channel (or its HTTP address)."""

    def __init__(self, art: Path, replicas: int, threads: int = 0, http: bool = False,
                 max_batch: int = 1) -> None:
        from difflet.runtime import client, difflet_pb2_grpc as pb_grpc
        from difflet.runtime.demo import launch_server, read_line

        args = ("--replicas", str(replicas), "--queue-size", "10000", "--threads", str(threads),
                "--max-batch", str(max_batch))
        self.proc = launch_server(art, args + (("--http-port", "0") if http else ()))
        self.http = read_line(self.proc, "http on ") if http else None
        self.address = read_line(self.proc, "listening on ")  # printed once SERVING
        self.channel = client.channel(self.address)
        self.stub = pb_grpc.DiffletStub(self.channel)

    def request(self, seed: int, steps: int):
        from difflet.runtime import client

        if self.http:
            return self._http_request(seed, steps)
        return self.stub.Generate(client.make_request(PROMPT, seed, steps=steps), timeout=3600)

    def _http_request(self, seed: int, steps: int) -> bytes:
        import base64
        import http.client

        host, port = self.http.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=3600)
        try:
            conn.request("POST", "/v1/images/generations", body=json.dumps(
                {"prompt": PROMPT, "seed": seed, "num_inference_steps": steps}),
                headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
        except OSError as err:
            raise HttpFailed(f"connection: {err}") from None
        finally:
            conn.close()
        if resp.status != 200:
            raise HttpFailed(f"HTTP {resp.status}")
        png = base64.b64decode(json.loads(body)["data"][0]["b64_json"])
        if not png.startswith(b"\x89PNG"):
            raise HttpFailed("not a PNG")
        return png

    def close(self) -> None:
        from difflet.runtime.demo import stop_server

        self.channel.close()
        stop_server(self.proc)


def isolated_latency(target: Target, steps: int, n: int = 7, warmup: int = 2) -> float:
    for i in range(warmup):
        target.request(i, steps)
    samples = []
    for i in range(n):
        start = time.perf_counter()
        target.request(100 + i, steps)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run_level(target: Target, times: list[float], steps: int) -> dict:
    import grpc

    results: list = [None] * len(times)
    threads = []
    t0 = time.perf_counter() + 0.05

    def one(i: int) -> None:
        sent = time.perf_counter()
        try:
            target.request(1000 + i, steps)
            results[i] = ("ok", time.perf_counter() - (t0 + times[i]))
        except grpc.RpcError as err:
            results[i] = (err.code().name, time.perf_counter() - sent)
        except HttpFailed as err:
            results[i] = (err.code, time.perf_counter() - sent)

    for i, at in enumerate(times):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)  # open loop: send at the arrival time, whatever is in flight
        thread = threading.Thread(target=one, args=(i,))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    ok = [lat for code, lat in results if code == "ok"]
    makespan = max((times[i] + r[1] for i, r in enumerate(results) if r[0] == "ok"), default=0.0) - times[0]
    return {"latencies": ok, "lost": len(times) - len(ok), "throughput": len(ok) / makespan if makespan else 0.0,
            "errors": sorted({code for code, _ in results if code != "ok"})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="requests per load level")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--loads", default="0.5,0.8,1.0,1.2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per model process (0 = the server's cpu_count // replicas)")
    parser.add_argument("--art", type=Path, default=None, help="artifact dir (else built)")
    parser.add_argument("--store", type=Path, default=REPO / ".pytest_cache" / "difflet-store")
    parser.add_argument("--http", action="store_true",
                        help="send OpenAI-style HTTP requests instead of gRPC Generate")
    parser.add_argument("--batching", action="store_true",
                        help="compare --max-batch 1 and 4 on a --batch-sizes 1,2,4 artifact")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    art = args.art or build_artifacts(args.store, [1, 2, 4] if args.batching else None)
    configs = ((("batching off", 1, 1), ("batching on", 1, 4)) if args.batching
               else (("1 process", 1, 1), ("2 replicas", 2, 1)))

    rows, raw = [], {}
    single = Target(art, 1, args.threads, args.http)
    try:
        iso = isolated_latency(single, args.steps)
        print(f"{'HTTP' if args.http else 'gRPC'}: isolated latency {iso * 1000:.0f} ms ({args.steps} steps); SLO {SLO_FACTOR}x = "
              f"{SLO_FACTOR * iso * 1000:.0f} ms", flush=True)
        sequences = {rho: arrivals(rho / iso, args.n, args.seed + k) for k, rho in enumerate(loads)}
        for name, replicas, max_batch in configs:
            own = replicas > 1 or max_batch > 1
            target = Target(art, replicas, args.threads, args.http, max_batch) if own else single
            try:
                if own:
                    run_level(target, [0.0] * replicas * max_batch, args.steps)  # first calls
                for rho, times in sequences.items():
                    res = run_level(target, times, args.steps)
                    lat = res["latencies"]
                    span = times[-1] - times[0]
                    realized = (len(times) - 1) / span * iso if span > 0 else float("nan")
                    row = {"config": name, "load": rho, "realized": realized,
                           "p50_s": percentile(lat, 0.5) if lat else float("nan"),
                           "p99_s": percentile(lat, 0.99) if lat else float("nan"),
                           "slo": sum(x <= SLO_FACTOR * iso for x in lat) / len(times),
                           "throughput_rps": res["throughput"],
                           "done": len(lat), "lost": res["lost"], "errors": res["errors"]}
                    rows.append(row)
                    raw[f"{name}@{rho}"] = lat
                    print(json.dumps(row), flush=True)
            finally:
                if own:
                    target.close()
    finally:
        single.close()

    print()
    if args.out:
        args.out.write_text(json.dumps({"isolated_s": iso, "steps": args.steps, "rows": rows}, indent=1))
    print(f"| config | load | realized | p50 s | p99 s | SLO ({SLO_FACTOR}x = {SLO_FACTOR * iso:.2f} s) "
          f"| throughput req/s | completed | lost |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['load']:.1f} | {r['realized']:.2f} | {r['p50_s']:.2f} | "
              f"{r['p99_s']:.2f} | {r['slo'] * 100:.0f}% | {r['throughput_rps']:.2f} | "
              f"{r['done']}/{r['done'] + r['lost']} | {r['lost']} |")
    return 1 if any(r["lost"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
