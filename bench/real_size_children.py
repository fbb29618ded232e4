"""The measured processes of bench/real_size.py (each run as `real_size.py --child NAME`):
Difflet's model-process code over the artifact, difflet-runtime serving it, and WanPipeline from
the same checkpoint with the per-program comparison on the inputs Difflet's programs were given."""
from __future__ import annotations

import time

PROMPT = "a red fox running through snow in a forest at dawn"
NEGATIVE = "blurry, low quality"
GUIDANCE = 5.0


def _rss_gib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 2**20 for line in f if line.startswith("VmRSS"))


def _vm_hwm_gib(pid: int | str = "self") -> float:
    """The kernel's high-water mark of a process's RSS (/proc/PID/status VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 2**20 for line in f if line.startswith("VmHWM"))


class RssSampler:
    """Every process of `pid`'s tree sampled every 0.2 s on a thread: the peak RSS per pid. Both
    sides of the comparison are measured this way and by VmHWM, which the kernel updates only when
    memory is unmapped, so it misses a peak that reclaim (this machine pages out cold file pages)
    lowers first."""

    def __init__(self, pid: int) -> None:
        import threading

        self.pid, self.peaks, self._done = pid, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while not self._done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            for q in tree:
                try:
                    self.peaks[q.pid] = max(self.peaks.get(q.pid, 0), q.memory_info().rss)
                except psutil.Error:
                    pass
            time.sleep(0.2)

    def stop(self) -> dict[int, int]:
        self._done.set()
        self._thread.join()
        return self.peaks


def child_serve(args) -> dict:
    """The model process's code over the artifact: load, warm-up, one timed request; saves the
    video, the final latents, the float decode and each program's first call (inputs, outputs)."""
    import numpy as np
    import torch

    from difflet.runtime.runner import ModelRunner
    from difflet.stepcache.plan import StepHooks

    start = time.perf_counter()
    runner = ModelRunner.from_artifacts(args.work / "art")
    res = {"load_s": round(time.perf_counter() - start, 1), "rss_after_load_gib": round(_rss_gib(), 2)}
    start = time.perf_counter()
    runner.warm_up()
    res["warm_up_s"] = round(time.perf_counter() - start, 1)
    captures: dict = {}
    for name, prog in list(runner.env.programs.items()):
        def first_call(*a, _prog=prog, _name=name):
            out = _prog(*a)
            captures.setdefault(_name, ([t.clone() for t in a], [t.clone() for t in out]))
            return out
        runner.env.programs[name] = first_call
    marks = [time.perf_counter()]
    hooks = StepHooks(lambda *_: marks.append(time.perf_counter()), None)
    params = runner.resolve(prompt=PROMPT, negative_prompt=NEGATIVE, seed=0, steps=args.steps, guidance=GUIDANCE)
    state, result = runner._run(params, hooks)
    steps = [b - a for a, b in zip(marks[1:], marks[2:])]  # marks[1] is the end of step 0
    res["request"] = {k: round(v / 1000, 2) for k, v in result.timings.items()}
    res["request"]["steps_s"] = [round(s, 2) for s in steps]
    res["request"]["denoise_step_s"] = round(result.timings["denoise"] / 1000 / args.steps, 2)
    res["peak_rss_gib"] = round(_vm_hwm_gib(), 2)
    np.save(args.work / "difflet_video.npy", result.video)
    torch.save({"captures": captures, "latents": state.values["latents"], "decoded": state.values["decoded"]},
               args.work / "difflet_values.pt")
    return res


def child_runtime(args) -> dict:
    """difflet-runtime over the artifact, started as a user starts it (API process + model process):
    until it serves (load + warm-up generation), then the same request over gRPC (lossless video)
    and stop. Each process's RSS sampled every 0.2 s: the model process's peak apart from the API
    process's."""
    import numpy as np
    import psutil

    from difflet.runtime import client
    from difflet.runtime.demo import launch_server, read_line, stop_server
    from difflet.runtime.media import decode_mp4

    start = time.perf_counter()
    proc = launch_server(args.work / "art", ("--lossless-video",))
    sampler = RssSampler(proc.pid)
    hwm: dict[int, float] = {}
    try:
        read_line(proc, "model process 0 ready: ", timeout=3600)
        address = read_line(proc, "listening on ", timeout=60)
        res = {"start_s": round(time.perf_counter() - start, 1)}
        start = time.perf_counter()
        reply = client.generate(address, PROMPT, 0, timeout=3600, negative_prompt=NEGATIVE, steps=args.steps,
                                guidance=GUIDANCE, height=args.height, width=args.width, frames=args.frames)
        total = time.perf_counter() - start
        for child in psutil.Process(proc.pid).children(recursive=True):  # before they exit
            hwm[child.pid] = _vm_hwm_gib(child.pid)
    finally:
        stop_server(proc)
        peaks = sampler.stop()
    tm = reply.timings
    res["request"] = {"total": round(total, 2), "encode": round(tm.encode_ms / 1000, 2),
                      "decode": round(tm.decode_ms / 1000, 2),
                      "denoise_step_s": round(tm.denoise_ms / 1000 / args.steps, 2)}
    # the model process holds the weights: the largest process of the server's tree
    model_pid = max((pid for pid in peaks if pid != proc.pid), key=peaks.get)
    res["model_process_peak_rss_gib"] = round(peaks[model_pid] / 2**30, 2)
    res["model_process_vm_hwm_gib"] = round(hwm[model_pid], 2)
    res["api_process_peak_rss_gib"] = round(peaks[proc.pid] / 2**30, 2)
    video, _ = decode_mp4(reply.mp4)
    np.save(args.work / "runtime_video.npy", video)
    return res


def _cos(a, b) -> float:
    import torch

    a, b = a.double().flatten(), b.double().flatten()
    return round(float(torch.nn.functional.cosine_similarity(a, b, dim=0)), 6)


def child_pipeline(args) -> dict:
    """WanPipeline from the checkpoint, the same request; then per-program cos on Difflet's inputs."""
    import numpy as np
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline

    start = time.perf_counter()
    vae = AutoencoderKLWan.from_pretrained(str(args.checkpoint), subfolder="vae", torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(str(args.checkpoint), vae=vae, torch_dtype=torch.bfloat16)
    res = {"load_s": round(time.perf_counter() - start, 1), "rss_after_load_gib": round(_rss_gib(), 2)}
    marks: list[float] = []

    def on_step(pipe_, i, t, kwargs):
        marks.append(time.perf_counter())
        return kwargs

    calls, loop_start = {}, {}
    for name in ("text_encoder", "transformer", "vae"):  # each module's wall time inside the call
        module = getattr(pipe, name)
        calls[name] = 0.0
        fn = module.decode if name == "vae" else module.forward

        def timed(*a, _fn=fn, _name=name, **k):
            s = time.perf_counter()
            loop_start.setdefault(_name, s)  # the transformer's first call opens the denoising loop
            try:
                return _fn(*a, **k)
            finally:
                calls[_name] += time.perf_counter() - s
        if name == "vae":
            module.decode = timed
        else:
            module.forward = timed
    import os

    sampler = RssSampler(os.getpid())
    start = time.perf_counter()
    with torch.no_grad():
        out = pipe(PROMPT, negative_prompt=NEGATIVE, generator=torch.Generator("cpu").manual_seed(0),
                   num_inference_steps=args.steps, guidance_scale=GUIDANCE, height=args.height,
                   width=args.width, num_frames=args.frames, max_sequence_length=512, output_type="np",
                   callback_on_step_end=on_step)
    total = time.perf_counter() - start
    res["sampled_peak_rss_gib"] = round(max(sampler.stop().values()) / 2**30, 2)  # the request's, before the cos
    steps = [b - a for a, b in zip(marks, marks[1:])]
    res["request"] = {"total": round(total, 2), "encode": round(calls["text_encoder"], 2),
                      "decode": round(calls["vae"], 2), "transformer_calls_s": round(calls["transformer"], 2),
                      "steps_s": [round(s, 2) for s in steps],
                      "denoise_step_s": round(calls["transformer"] / args.steps, 2),
                      # the whole loop per step (scheduler, CFG combine): what Difflet's denoise phase times
                      "loop_step_s": round((marks[-1] - loop_start["transformer"]) / args.steps, 2)}
    res["peak_rss_gib"] = round(_vm_hwm_gib(), 2)
    video = (out.frames[0] * 255).round().astype(np.uint8)
    np.save(args.work / "pipeline_video.npy", video)
    del out
    res["cos"] = _program_cos(pipe, args)
    return res


def _program_cos(pipe, args) -> dict:
    """Each Difflet program's first-call output against the diffusers module on the same inputs."""
    import torch

    values = torch.load(args.work / "difflet_values.pt")
    caps = values["captures"]
    cos = {}
    with torch.no_grad():
        (ids, valid), (embeds, *_) = caps["text_encoder"]
        n = int(valid)
        mask = (torch.arange(ids.shape[1]) < n).long()[None]
        ref = pipe.text_encoder(ids, attention_mask=mask).last_hidden_state
        ref[:, n:] = 0  # WanPipeline cuts the embeddings to the prompt and zero-pads them
        cos["text_encoder"] = _cos(embeds, ref)
        (hidden, t, text), (sample, *_) = caps["transformer"]
        ref = pipe.transformer(hidden_states=hidden, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        cos["transformer"] = _cos(sample, ref)
        vae = pipe.vae
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        ref = vae.decode(values["latents"].float() * std + mean, return_dict=False)[0]
        cos["vae"] = _cos(values["decoded"], ref)
    return cos


def child_floor(args) -> dict:
    """The noise floor of this comparison: WanPipeline again with another valid attention kernel
    (SDPA's math backend instead of the fused CPU kernel: the same function, other rounding)."""
    import numpy as np
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline
    from torch.nn.attention import SDPBackend, sdpa_kernel

    vae = AutoencoderKLWan.from_pretrained(str(args.checkpoint), subfolder="vae", torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(str(args.checkpoint), vae=vae, torch_dtype=torch.bfloat16)
    start = time.perf_counter()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        out = pipe(PROMPT, negative_prompt=NEGATIVE, generator=torch.Generator("cpu").manual_seed(0),
                   num_inference_steps=args.steps, guidance_scale=GUIDANCE, height=args.height,
                   width=args.width, num_frames=args.frames, max_sequence_length=512, output_type="np")
    np.save(args.work / "pipeline_math_video.npy", (out.frames[0] * 255).round().astype(np.uint8))
    return {"request_s": round(time.perf_counter() - start, 1), "sdpa": "math"}
