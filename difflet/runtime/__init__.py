"""The host runtime: the IR's schedule executed over compiled programs, served over gRPC.

Layers, each usable without the next: `schedule` (+ `host/` steps by family) runs one request;
`runner.ModelRunner` loads ART/ once and serialises requests; `service` exposes it as
difflet.v1.Difflet with health and reflection; `server` is the `difflet-runtime` process;
`client`/`commands` are the `difflet generate`/`difflet demo` side. Serving is two processes:
the torch-free API process (`server`, `service`, `admission`, `dispatcher`, `replica`,
`startup`, `metrics`, `messages`) and model processes (`model_process`, forked from a
forkserver that preloaded torch) that own the runner.
"""
