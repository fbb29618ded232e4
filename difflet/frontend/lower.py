"""Lowering: a parsed model description + a serving profile -> the pipeline-level IR Module.

Invariants:
- The output is exactly docs/ir.md's pipeline level: module attrs family/profile/source; body =
  runtime nodes, component nodes (inputs, outputs, attention sites), one `schedule` of steps.
- Every node carries the `Loc` of the DSL declaration it came from (path as given).
- Every shape is fully static for the profile; only declared runtime values stay symbolic.
- With `weights` (a checkpoint directory), `config from checkpoint` components take the
  checkpoint's config.json and stated configs are checked against it; without, they take their
  `default { ... }` (or have no config attr). Expressions see the resolved configs, plus the
  keys the family derives from them (FamilyFacts.derived_config), which stay out of the IR.
- The result passes `difflet.ir.verify.verify`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from difflet.errors import DiffletError
from difflet.frontend import ast, checks
from difflet.frontend.checkpoint_config import CheckpointConfigs, resolve_checkpoint_dir
from difflet.frontend.classes import ClassError, config_keys, count_params, resolve_class
from difflet.frontend.parse import parse_text
from difflet.frontend.profile import apply_overrides, derive_profile
from difflet.frontend.shapes import Evaluator, Source, resolve_dtype, with_derived
from difflet.ir.nodes import Attrs, Module, Node, Op, RuntimeType, TensorType, Value

ROLES = ("encoder", "denoiser", "decoder")
ATTENTION_KINDS = ("joint", "self", "cross")
ATTENTION_REQUIRED = {"joint": ("heads", "head_dim", "order", "text_mask", "valid"),
                      "self": ("heads", "head_dim"),
                      "cross": ("heads", "head_dim", "text_mask")}
ATTENTION_FIELDS = ("heads", "head_dim", "order", "text_mask", "valid")


def lower_file(path: str | Path, overrides: dict[str, str] | None = None, weights: str | None = None,
               shapes: Sequence[str] | None = None, batches: Sequence[int] | None = None) -> Module:
    """Parse and lower a `.dsl` file for the profile with `overrides` (CLI `--profile k=v`),
    taking `config from checkpoint` configs from `weights` (CLI `--weights`) when given; with
    `shapes` (CLI `--shapes WxH,...`, else the profile's `shapes = "WxH,..."`), one bucketed
    module serving every size (difflet/ir/buckets.py); with `batches` (CLI `--batch-sizes 1,2,4`,
    else the profile's `batch_sizes = "1,2,4"`), every size also at each batch size."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise DiffletError(f"cannot read model description: {err.strerror}", where=str(path)) from None
    module = lower_text(text, str(path), overrides, weights)
    from difflet.ir.buckets import size_of, split_batches, split_sizes

    profile = module.attrs["profile"]
    if not shapes and isinstance(profile.get("shapes"), str):
        shapes = split_sizes(profile["shapes"])
    if not batches and isinstance(profile.get("batch_sizes"), str):
        batches = split_batches(profile["batch_sizes"], where=f"{path}: profile batch_sizes")
    if batches and batches != [1] and "batch" not in profile.keys():
        raise DiffletError("batch sizes need a `batch` profile parameter that the denoiser's "
                           "per-sample shapes use (e.g. `dtype[batch, tokens, channels]`)",
                           where=module.loc)
    if not shapes and not (batches and batches != [1]):
        return module
    return lower_buckets(text, str(path), shapes or [size_of(profile)], overrides, weights,
                         "frames" in profile.keys(), batches or [1])


def lower_buckets(text: str, path: str, shapes: Sequence[str], overrides: dict[str, str] | None = None,
                  weights: str | None = None, video: bool = False,
                  batches: Sequence[int] = (1,)) -> Module:
    """The description lowered at each size ("WxH", video "WxHxF") and batch size, merged into
    one module (buckets in that order: every batch size of the first size first)."""
    from difflet.ir.buckets import merge, parse_size

    modules = []
    for size in shapes:
        for batch in batches:
            sized = {k: str(v) for k, v in parse_size(size, video).items()}
            if batch != 1:
                sized["batch"] = str(batch)
            modules.append(lower_text(text, path, {**(overrides or {}), **sized}, weights))
    return merge(modules)


def lower_text(text: str, path: str, overrides: dict[str, str] | None = None,
               weights: str | None = None) -> Module:
    """Like `lower_file`, for source already in memory; `path` is used in locations."""
    from difflet.ir.verify import verify

    src = Source(path, text)
    model = parse_text(text, path)
    ckpt = CheckpointConfigs(resolve_checkpoint_dir(weights), src) if weights is not None else None
    module = _Lowering(src, model, overrides or {}, ckpt).module()
    verify(module)
    return module


class _Lowering:
    def __init__(self, src: Source, model: ast.ModelDecl, overrides: dict[str, str],
                 ckpt: CheckpointConfigs | None = None) -> None:
        self.src, self.model, self.ckpt = src, model, ckpt
        self.profile = apply_overrides(src, model, overrides)
        self.configs = {c.name: self.config(c) for c in model.components}
        from difflet.families import facts

        self.family = family = facts(model.family)
        configs = with_derived(self.configs, model.components, family.derived_config)  # expressions read these
        derive_profile(self.profile, overrides, configs, model.components, family.derived_profile)
        self.ev = Evaluator(src, self.profile, configs)
        self.runtimes: dict[str, RuntimeType] = {}

    def config(self, c: ast.ComponentDecl) -> Attrs | None:
        """The component's config: stated, from the checkpoint, its default, or None (unknown)."""
        written = Evaluator(self.src, self.profile).map(c.config) if c.config is not None else None
        if self.ckpt is None:
            return written
        if c.config_from_checkpoint:
            return self.ckpt.config(c, self.resolve(c.qualname, c.qualname_span))
        self.ckpt.check_stated(c, written)
        return written

    def error(self, message: str, span: ast.Span) -> DiffletError:
        return self.src.error(message, span)

    def module(self) -> Module:
        m = self.model
        body = [self.runtime(r) for r in m.runtimes]
        decoders = [c for c in m.components if c.role == "decoder"]
        self.decoder_cfg = self.configs[decoders[0].name] if decoders else None
        names: set[str] = set()
        for comp in m.components:
            if comp.name in names:
                raise self.error(f"duplicate component {comp.name!r}", comp.span)
            names.add(comp.name)
            body.append(self.component(comp))
        if m.schedule_span is None:
            raise self.error("the model has no schedule { ... }", m.span)
        body.append(Node(Op.SCHEDULE, "main", body=tuple(self.step(s, names) for s in m.steps),
                         loc=self.src.loc(m.schedule_span)))
        from difflet.families import FAMILIES

        if m.family not in FAMILIES:  # its host steps and declarations would be found nowhere
            raise self.error(f"unknown model family {m.family!r} (registered: {', '.join(FAMILIES)})", m.span)
        attrs = Attrs([("family", m.family), ("profile", Attrs(self.profile)), ("source", self.src.path)])
        return Module(m.name, "pipeline", attrs, tuple(body), loc=self.src.loc(m.span))

    # ---- runtime values
    def runtime(self, r: ast.RuntimeDecl) -> Node:
        if r.name in self.runtimes:
            raise self.error(f"duplicate runtime value {r.name!r}", r.span)
        lo, hi = self.ev.int_expr(r.lo, "a range bound"), self.ev.int_expr(r.hi, "a range bound")
        default = self.ev.int_expr(r.default, "a default")
        if lo > hi:
            raise self.error(f"runtime value {r.name!r} has an empty range [{lo}, {hi}]", r.span)
        if not lo <= default <= hi:
            raise self.error(f"default {default} of {r.name!r} is outside [{lo}, {hi}]", r.default.span)
        rtype = RuntimeType(resolve_dtype(self.src, r.dtype, self.profile, r.span), lo, hi)
        self.runtimes[r.name] = rtype
        return Node(Op.RUNTIME, r.name, Attrs(default=default, doc=r.doc),
                    results=(Value(r.name, rtype),), loc=self.src.loc(r.span))

    # ---- components
    def resolve(self, qualname: str, span: ast.Span) -> type:
        try:
            return resolve_class(qualname)
        except ClassError as err:
            raise self.error(str(err), span) from None

    def component(self, c: ast.ComponentDecl) -> Node:
        if c.role not in ROLES:
            raise self.error(f"unknown role {c.role!r} (allowed: {', '.join(ROLES)})", c.span)
        cls = self.resolve(c.qualname, c.qualname_span)
        settings = self.settings(c)
        entry = settings.get("entry", ("forward", None))
        if not callable(getattr(cls, entry[0], None)):
            raise self.error(f"{c.qualname} has no method {entry[0]!r}", entry[1])
        dtype = self.component_dtype(c, settings)
        config = self.configs[c.name]
        attrs: list[tuple[str, Any]] = [("role", c.role), ("class", c.qualname), ("subfolder", c.subfolder)]
        if config is not None:
            attrs.append(("config", config))
        attrs += [("entry", entry[0]), ("dtype", dtype)]
        if c.options is not None:
            checks.check_options(self.src, self.family.options.get(c.qualname, ()), c)
            attrs.append(("options", self.ev.map(c.options)))
        if c.tokenizer is not None:
            attrs.append(("tokenizer", self.tokenizer(c)))
        if config is not None:
            if c.config is not None:
                checks.check_config_keys(self.src, config_keys(cls), c)
            try:
                counts = count_params(c.qualname, config)
            except ClassError as err:
                raise self.error(str(err), c.qualname_span) from None
            attrs += [("params", counts.params), ("params_blocks_linear", counts.params_blocks_linear),
                      ("num_blocks", counts.num_blocks)]
        shapes: dict[str, tuple[int, ...]] = {}
        body = [self.input(i, shapes) for i in c.inputs] + [self.output(o, shapes) for o in c.outputs]
        if c.attentions and c.role != "denoiser":
            raise self.error("attention sites are declared on denoisers only", c.attentions[0].span)
        body += [self.attention(a, config) for a in c.attentions]
        if c.role == "denoiser":
            checks.check_denoiser(self.src, c, config, shapes, self.decoder_cfg, self.profile)
        if c.role == "decoder":
            checks.check_decoder(self.src, c, config, shapes)
        return Node(Op.COMPONENT, c.name, Attrs(attrs), body=tuple(body), loc=self.src.loc(c.span))

    def settings(self, c: ast.ComponentDecl) -> dict[str, tuple[str, ast.Span]]:
        found: dict[str, tuple[str, ast.Span]] = {}
        for s in c.settings:
            if s.key in found:
                raise self.error(f"duplicate setting {s.key!r}", s.span)
            found[s.key] = (s.value, s.span)
        return found

    def component_dtype(self, c: ast.ComponentDecl, settings: dict) -> str:
        if "dtype" in settings:
            name, span = settings["dtype"]
            return resolve_dtype(self.src, name, self.profile, span)
        if "dtype" not in self.profile:
            raise self.error(f"component {c.name!r} needs `dtype ...` (the profile has no dtype)", c.span)
        return resolve_dtype(self.src, "dtype", self.profile, c.span)

    def tokenizer(self, c: ast.ComponentDecl) -> Attrs:
        t = c.tokenizer
        if c.role != "encoder":
            raise self.error("only encoders have a tokenizer", t.span)
        self.resolve(t.qualname, t.span)
        return Attrs([("class", t.qualname), ("subfolder", t.subfolder),
                      ("max_length", self.ev.int_expr(t.max_length, "max_length"))])

    def tensor(self, spec: ast.TensorSpec) -> TensorType:
        return TensorType(resolve_dtype(self.src, spec.dtype, self.profile, spec.span), self.ev.shape(spec))

    def input(self, i: ast.InputDecl, shapes: dict) -> Node:
        if i.name in shapes:
            raise self.error(f"duplicate input/output {i.name!r}", i.span)
        if i.runtime is not None:
            if i.runtime not in self.runtimes:
                raise self.error(f"undefined runtime value {i.runtime!r} (declared: "
                                 f"{', '.join(self.runtimes) or 'none'})", i.span)
            shapes[i.name] = ()
            return Node(Op.INPUT, i.name, args=(i.runtime,),
                        results=(Value(i.name, self.runtimes[i.runtime]),), loc=self.src.loc(i.span))
        ttype = self.tensor(i.tensor)
        shapes[i.name] = ttype.shape
        return Node(Op.INPUT, i.name, results=(Value(i.name, ttype),), loc=self.src.loc(i.span))

    def output(self, o: ast.OutputDecl, shapes: dict) -> Node:
        if o.name in shapes:
            raise self.error(f"duplicate input/output {o.name!r}", o.span)
        ttype = self.tensor(o.tensor)
        shapes[o.name] = ttype.shape
        return Node(Op.OUTPUT, o.name, Attrs(select=o.select), results=(Value(o.name, ttype),),
                    loc=self.src.loc(o.span))

    def attention(self, a: ast.AttentionDecl, config: Attrs | None) -> Node:
        if a.kind not in ATTENTION_KINDS:
            raise self.error(f"unknown attention kind {a.kind!r} (allowed: {', '.join(ATTENTION_KINDS)})",
                             a.span)
        fields: dict[str, Any] = {}
        for key, value, span in a.fields:
            if key in fields:
                raise self.error(f"duplicate attention field {key!r}", span)
            if key in ("heads", "head_dim"):
                value = self.ev.int_expr(value, key)
            if key == "valid" and value not in self.runtimes:
                raise self.error(f"undefined runtime value {value!r} (declared: "
                                 f"{', '.join(self.runtimes) or 'none'})", span)
            fields[key] = value
        missing = [k for k in ATTENTION_REQUIRED[a.kind] if k not in fields]
        if missing:
            raise self.error(f"{a.kind} attention site needs {', '.join(missing)}", a.span)
        checks.check_attention(self.src, a, fields, config)
        attrs = [("kind", a.kind)] + [(k, fields[k]) for k in ATTENTION_FIELDS if k in fields]
        return Node(Op.ATTENTION, a.pattern, Attrs(attrs), loc=self.src.loc(a.span))

    # ---- schedule
    def step(self, s: ast.StepDecl, components: set[str]) -> Node:
        for name, span in s.components:
            if name not in components:
                raise self.error(f"undefined component {name!r} (declared: "
                                 f"{', '.join(sorted(components)) or 'none'})", span)
        if s.params is not None:
            self._check_classes(s.params)
        params = self.ev.map(s.params) if s.params is not None else Attrs()
        return Node(Op.STEP, s.name, params, args=tuple(n for n, _ in s.components),
                    loc=self.src.loc(s.span))

    def _check_classes(self, value: ast.Value) -> None:
        """Class objects inside step parameters (e.g. the scheduler) must resolve."""
        if isinstance(value, ast.ClassObject):
            self.resolve(value.qualname, value.qualname_span)
            self._check_classes(value.config)
        elif isinstance(value, ast.MapV):
            for e in value.entries:
                self._check_classes(e.value)
        elif isinstance(value, ast.ListV):
            for v in value.items:
                self._check_classes(v)
