"""The frontend: model-description DSL (grammars/difflet.lark) -> AST -> pipeline IR.

Entry point: `difflet.frontend.lower.lower_file(path, overrides=None, weights=None) -> Module`
(CLI `difflet lower FILE.dsl [--profile k=v,...] [--weights DIR] [-o OUT.ir]`). Modules, one idea
each: parse.py (text -> ast.py dataclasses), profile.py (defaults + overrides), shapes.py
(expression evaluation, dtypes), classes.py (class lookup, meta-device parameter counts),
checkpoint_config.py (configs read from a checkpoint's config.json files), checks.py (shapes vs
configs and profile), lower.py (AST -> IR), commands.py (CLI).

The DSL in one screen (every description under models/ is a full example):

    model NAME family FAMILY
    profile { height = 1024  dtype = bfloat16 ... }          # overridable defaults
    runtime NAME: int64 in [LO, HI] default EXPR [doc "..."]  # crosses in per request/step
    ROLE NAME = diffusers.Class from "subfolder" {            # ROLE: encoder|denoiser|decoder
        config { key: value, ... }   # stated: --weights must agree
        | config from checkpoint [default { key: value, ... }]  # --weights' config.json, else default
        entry METHOD                 # default forward
        dtype DTYPE_OR_PROFILE_NAME  # default: the profile's `dtype`
        options { key: value, ... }  # keys the family declares (FamilyFacts.options), e.g. stg_blocks
        tokenizer transformers.Class from "subfolder" max_length EXPR   # encoders
        input NAME: DTYPE[EXPR, ...]   |   input NAME: runtime RUNTIME_NAME
        output NAME: DTYPE[EXPR, ...] select "field" | INDEX
        attention "glob.*.attn": joint|self|cross heads E head_dim E
            order (text, visual) text_mask BOOL valid RUNTIME_NAME        # denoisers
    }
    schedule { family.step(component, ...) { key: value, ... } ... }

Values: numbers, "strings", true/false/null, [lists], { maps }, `pkg.Class { config }`
(-> {class, config}), and integer expressions over profile parameters and component configs
(`vae.latent_channels`, nested `text_encoder.text_config.hidden_size`,
`len(vae.block_out_channels)`; also keys the description's family
derives from a config through the registry, FamilyFacts.derived_config) with + - * / // ** and
parentheses, where `/` must divide exactly. Config values themselves refer to neither.
"""
