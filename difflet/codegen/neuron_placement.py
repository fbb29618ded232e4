"""Which NeuronCores each program of a neuron ART loads on, per model process (torch-free data).

Sources (Neuron SDK 2.29 docs, aws-neuron-sdk v2.29.1): neuron-runtime/nrt-configurable-parameters.rst
(NEURON_RT_VISIBLE_CORES: a single index or an inclusive range, reserved by the process when its
runtime starts; it takes precedence over NEURON_RT_NUM_CORES; indices are logical cores under
LNC=2, frameworks/torch/torch-neuronx/programming-guide/training/pytorch-neuron-programming-guide.rst);
frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-core-placement.rst
(`start_nc` counts from the process's first visible core). NxD: `NxDModel.load(path, start_rank,
local_ranks_size)` (neuronx-distributed src/neuronx_distributed/trace/nxd_model/nxd_model.py) takes a
RANK, not a core: NxD Inference starts one process per node with NEURON_RT_VISIBLE_CORES=16-31 and
start_rank_id=16 (examples/multi_node.md), so a process's local ranks sit on its visible cores in order.

Plan (per model process = one runtime replica, `replicas` of them):
- Every split (SPMD) component loads with start_rank=0, local_ranks_size=world: its ranks take the
  process's cores [0, world) (NxD offers no core offset within a process). The denoiser is the
  widest, so the process needs at least W = max world cores.
- Single-core (tp1) programs go AFTER the denoiser's cores, one core each ("disjoint"), when the
  replica's share of the instance has room; with fewer spare cores they share the spare cores in
  turn; with none (FLUX TP4 on a trn2.3xlarge's 4 cores) they sit on the denoiser's cores, last
  core first ("shared"): the residency the paper (section 6) and NxD Inference's FLUX application
  use, whose memory passes/component_tp.py already judged per core. Never implicit round-robin.
- Replica k's process sees cores [first + k*R, first + (k+1)*R): replicas never share a core.
- The instance's cores: NEURON_RT_VISIBLE_CORES of the server if set, else /dev/neuron<N> devices
  times the target's cores_per_device, else one device; capped by the target's max_cores.
  Needing more than that (replicas * W) is a DiffletError naming the components.
- The model process sets NEURON_RT_VISIBLE_CORES (and DIFFLET_NEURON_PLACEMENT, program -> relative
  cores) before anything imports the Neuron runtime (`place_process`); the loaders read their slot
  with `slot_of`, or plan replica 0 of 1 themselves when no model process set it (in-process use).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from difflet.errors import DiffletError

PLACEMENT_ENV = "DIFFLET_NEURON_PLACEMENT"
VISIBLE_ENV = "NEURON_RT_VISIBLE_CORES"


@dataclass(frozen=True)
class Slot:
    """One component's cores in its process: [start, start + count), relative to the first visible core."""

    component: str
    start: int
    count: int
    programs: tuple[str, ...]  # ART-relative program paths (buckets, branches, ranks) loaded there


@dataclass(frozen=True)
class ProcessPlan:
    """Model process `replica`: it sees absolute cores [first, first + cores); `shared` when tp1
    programs sit on denoiser-rank cores (no spare core on this instance)."""

    replica: int
    first: int
    cores: int
    slots: tuple[Slot, ...]
    shared: bool

    def visible_cores(self) -> str:
        """NEURON_RT_VISIBLE_CORES for this process (the documented single index or inclusive range)."""
        last = self.first + self.cores - 1
        return str(self.first) if last == self.first else f"{self.first}-{last}"

    def slot(self, component: str) -> Slot:
        return next(s for s in self.slots if s.component == component)

    def absolute(self, component: str) -> range:
        s = self.slot(component)
        return range(self.first + s.start, self.first + s.start + s.count)

    def env(self) -> dict[str, str]:
        cores = {p: [s.start, s.count] for s in self.slots for p in s.programs}
        return {VISIBLE_ENV: self.visible_cores(), PLACEMENT_ENV: json.dumps(cores, sort_keys=True)}


@dataclass(frozen=True)
class _Unit:
    name: str
    role: str
    width: int
    programs: tuple[str, ...]


def _units(components: Mapping[str, Any]) -> list[_Unit]:
    """Manifest entries grouped per component (NAME@SIZE buckets with NAME), manifest order."""
    out: dict[str, _Unit] = {}
    for name, c in components.items():
        base = name.split("@", 1)[0]
        progs = [f.program.path for f in c.ranks] + [b.files.program.path for b in c.branches]
        width = c.world * c.cfg
        old = out.get(base)
        if old is not None:
            width, progs = max(width, old.width), [*old.programs, *progs]
        out[base] = _Unit(base, c.role, width, tuple(dict.fromkeys(progs)))
    return list(out.values())


def plan(components: Mapping[str, Any], first: int, count: int, replicas: int = 1,
         where: object = None) -> list[ProcessPlan]:
    """Placement of every program of `components` (manifest entries) for `replicas` model processes
    on the instance's cores [first, first + count) (see module invariants)."""
    units = _units(components)
    if replicas < 1 or not units:
        raise DiffletError(f"cannot place {replicas} replicas of {len(units)} components", where=where)
    split = sorted((u for u in units if u.width > 1), key=lambda u: (u.role != "denoiser", -u.width))
    single = [u for u in units if u.width == 1]
    width = max(u.width for u in units)
    share = count // replicas
    if width > share:
        named = ", ".join(f"{u.name}: {u.width} ranks" for u in split)
        raise DiffletError(f"the ART needs {replicas} x {width} NeuronCores ({named}; "
                           f"{', '.join(u.name for u in single) or 'nothing'} on one core each) but the "
                           f"instance has {count} (cores {first}-{first + count - 1}); use a smaller layout, "
                           f"fewer replicas or a larger instance", where=where)
    spare = min(share - width, len(single))
    per = width + spare
    slots = [Slot(u.name, 0, u.width, u.programs) for u in split]
    for i, u in enumerate(single):
        core = width + i % spare if spare else (width - 1 - i) % width
        slots.append(Slot(u.name, core, 1, u.programs))
    return [ProcessPlan(k, first + k * per, per, tuple(slots), shared=not spare and bool(single))
            for k in range(replicas)]


def parse_visible(text: str, where: str = VISIBLE_ENV) -> tuple[int, int]:
    """(first, count) of a NEURON_RT_VISIBLE_CORES value: "N" or "A-B" (inclusive), as documented."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
        raise DiffletError(f"{text!r} is not a NeuronCore index or inclusive range (like 0-3)", where=where)
    lo = int(m.group(1))
    return lo, (int(m.group(2)) if m.group(2) is not None else lo) - lo + 1


def instance_cores(target: Mapping[str, Any], environ: Mapping[str, str] = os.environ,
                   dev: Path = Path("/dev")) -> tuple[int, int]:
    """(first, count) of the cores this server may use (module invariants), capped by max_cores."""
    if environ.get(VISIBLE_ENV):
        first, count = parse_visible(environ[VISIBLE_ENV])
    else:
        if environ.get("NEURON_RT_NUM_CORES", "0") not in ("", "0"):
            raise DiffletError("Difflet places each model process on explicit cores; set "
                               "NEURON_RT_VISIBLE_CORES (a range) instead of NEURON_RT_NUM_CORES",
                               where="NEURON_RT_NUM_CORES")
        devices = len([p for p in dev.glob("neuron*") if re.fullmatch(r"neuron\d+", p.name)]) if dev.is_dir() else 0
        first, count = 0, max(devices, 1) * int(target["cores_per_device"])
    return first, min(count, int(target["max_cores"]))


def manifest_plan(root: Path, replicas: int = 1, environ: Mapping[str, str] = os.environ,
                  dev: Path = Path("/dev")) -> list[ProcessPlan]:
    from difflet.codegen.manifest import MANIFEST, read_manifest
    from difflet.passes.targets import load_target

    manifest = read_manifest(root)
    first, count = instance_cores(load_target(manifest.target), environ, dev)
    return plan(manifest.components, first, count, replicas, where=Path(root) / MANIFEST)


def place_process(config: Mapping[str, Any], environ=os.environ) -> ProcessPlan | None:
    """Model-process start (runtime/model_process.serve): for a neuron ART, set this replica's
    NEURON_RT_VISIBLE_CORES and program placement in `environ`; None for other backends."""
    from difflet.codegen.manifest import read_manifest

    root = Path(config["root"])
    if read_manifest(root).backend != "neuron":
        return None
    mine = manifest_plan(root, int(config.get("replicas") or 1), environ)[int(config.get("replica") or 0)]
    environ.update(mine.env())
    return mine


def slot_of(program: str | os.PathLike, environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(start, count) relative to the visible cores for the program file ART/programs/<file>."""
    path = Path(program)
    rel = f"{path.parent.name}/{path.name}"
    if environ.get(PLACEMENT_ENV):
        cores = json.loads(environ[PLACEMENT_ENV])
    else:  # loaded outside a model process: this process is replica 0 of 1
        cores = json.loads(manifest_plan(path.parent.parent, 1, environ)[0].env()[PLACEMENT_ENV])
    if rel not in cores:
        raise DiffletError(f"{rel} has no NeuronCore in this process's placement ({PLACEMENT_ENV}); "
                           "the ART's manifest does not list it", where=path)
    start, count = cores[rel]
    return int(start), int(count)
