"""The description found from a checkpoint's model_index.json when no model is named
(difflet/frontend/discover.py): `DiffletPipeline.from_pretrained(DIR)`, `difflet lower --weights DIR`.

Oracle: the `_class_name` diffusers itself wrote into each tiny family's saved checkpoint
(`save_pretrained` of the real pipeline classes' components) and the family table of the README;
invalid directories beside valid ones, each error naming the file.
"""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from conftest import REPO
from difflet.cli import main
from difflet.errors import DiffletError
from difflet.frontend.discover import description_for
from oracle_util import planned_tiny, random_checkpoint

# tiny checkpoint -> (the pipeline class diffusers saved, the real-size description serving it)
CASES = {"flux-tiny": ("FluxPipeline", "flux"), "qwen-image-tiny": ("QwenImagePipeline", "qwen-image"),
         "wan2.1-tiny": ("WanPipeline", "wan2.1"), "hunyuan-video-tiny": ("HunyuanVideoPipeline", "hunyuan-video"),
         "ltx2-tiny": ("LTX2Pipeline", "ltx2")}


@pytest.mark.parametrize("tiny", sorted(CASES))
def test_each_family_is_found_from_its_checkpoint(tiny):
    ckpt = random_checkpoint(planned_tiny(REPO / "models" / f"{tiny}.dsl"))
    pipeline, description = CASES[tiny]
    assert json.loads((ckpt / "model_index.json").read_text())["_class_name"] == pipeline
    assert description_for(str(ckpt)).name == f"{description}.dsl"


def test_a_flux_transformer_without_guidance_embedding_gets_the_schnell_description():
    """flux-shapes (guidance_embeds false, as FLUX.1-schnell) -> flux-schnell.dsl (guidance mode none)."""
    shapes = REPO / "difflet" / "assets" / "flux-shapes"
    assert json.loads((shapes / "transformer" / "config.json").read_text())["guidance_embeds"] is False
    assert description_for(str(shapes)).name == "flux-schnell.dsl"


def test_an_image_input_pipeline_class_gets_its_description(tmp_path):
    """FLUX.1-Kontext-dev and Wan2.1-I2V checkpoints name FluxKontextPipeline and
    WanImageToVideoPipeline (their diffusers repos' model_index.json)."""
    i2v = random_checkpoint(planned_tiny(REPO / "models" / "wan2.1-tiny-i2v.dsl"))
    assert json.loads((i2v / "model_index.json").read_text())["_class_name"] == "WanImageToVideoPipeline"
    assert description_for(str(i2v)).name == "wan2.1-i2v.dsl"
    kontext = tmp_path / "kontext"
    shutil.copytree(REPO / "difflet" / "assets" / "flux-shapes", kontext)
    index = json.loads((kontext / "model_index.json").read_text())
    (kontext / "model_index.json").write_text(json.dumps({**index, "_class_name": "FluxKontextPipeline"}))
    assert description_for(str(kontext)).name == "flux-kontext.dsl"


def test_a_wan_checkpoint_with_a_low_noise_expert_gets_the_two_expert_description():
    """Wan2.2-T2V-A14B-Diffusers is a WanPipeline checkpoint whose model_index.json lists
    transformer_2; a Wan 2.1 one lists it as [null, null] (WanPipeline's optional component)."""
    two = random_checkpoint(planned_tiny(REPO / "models" / "wan2.2-tiny.dsl"))
    assert json.loads((two / "model_index.json").read_text())["transformer_2"] == ["diffusers", "WanTransformer3DModel"]
    assert description_for(str(two)).name == "wan2.2-a14b.dsl"
    one = random_checkpoint(planned_tiny(REPO / "models" / "wan2.1-tiny.dsl"))
    assert json.loads((one / "model_index.json").read_text())["transformer_2"] == [None, None]
    assert description_for(str(one)).name == "wan2.1.dsl"


def test_unsupported_missing_and_random_checkpoints_are_named(tmp_path):
    (tmp_path / "sd").mkdir()
    (tmp_path / "sd" / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(DiffletError) as err:
        description_for(str(tmp_path / "sd"))
    assert err.value.where == str(tmp_path / "sd" / "model_index.json")
    assert err.value.message == ("_class_name 'StableDiffusionPipeline' is not a pipeline Difflet serves "
                                 "(supported: FluxPipeline, QwenImagePipeline, WanPipeline, "
                                 "HunyuanVideoPipeline, LTX2Pipeline, Flux2KleinPipeline, FluxKontextPipeline, "
                                 "WanImageToVideoPipeline)")
    with pytest.raises(DiffletError, match="no model_index.json") as err:
        description_for(str(tmp_path))
    assert err.value.where == str(tmp_path / "model_index.json")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model_index.json").write_text("{not json")
    with pytest.raises(DiffletError, match="cannot read the pipeline class"):
        description_for(str(tmp_path / "bad"))
    with pytest.raises(DiffletError, match="random:0 has no model_index.json") as err:
        description_for("random:0", where="--weights")
    assert err.value.where == "--weights"


def test_a_flux_checkpoint_without_its_transformer_config_is_named(tmp_path):
    ckpt = tmp_path / "flux"
    shutil.copytree(REPO / "difflet" / "assets" / "flux-shapes", ckpt)
    (ckpt / "transformer" / "config.json").unlink()
    with pytest.raises(DiffletError, match="cannot choose the flux description") as err:
        description_for(str(ckpt))
    assert err.value.where == str(ckpt)


def test_lower_without_a_description_reads_the_checkpoint():
    shapes = str(REPO / "difflet" / "assets" / "flux-shapes")
    r = CliRunner().invoke(main, ["lower", "--weights", shapes, "--profile", "height=32,width=32,max_text=16"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("module @flux_schnell level=pipeline {") and 'family = "flux"' in r.output
    r = CliRunner().invoke(main, ["lower"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "give a model description (DSL), or --weights DIR" in r.output
    r = CliRunner().invoke(main, ["lower", "--weights", "random:1"])
    assert r.exit_code == 2 and "random:1 has no model_index.json" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("tiny", sorted(CASES))
def test_the_found_description_lowers_each_tiny_checkpoint_to_the_tiny_descriptions_shapes(tiny):
    """What `from_pretrained(DIR)` with no model lowers before it compiles: the real-size description,
    its configs from the tiny checkpoint and its sizes from the tiny profile, gives every program
    input and output the shape the hand-written tiny description states (the independent oracle)."""
    from difflet.frontend.lower import lower_file
    from difflet.ir.nodes import Op

    stated = planned_tiny(REPO / "models" / f"{tiny}.dsl")
    ckpt = random_checkpoint(stated)
    profile = stated.attrs["profile"].to_python()
    sizes = {k: str(profile[k]) for k in ("height", "width", "frames", "max_text", "dtype") if k in profile}
    found = lower_file(str(description_for(str(ckpt))), sizes, str(ckpt))

    def shapes(module):
        return {(c.name, n.name): tuple(n.results[0].type.shape) for c in module.components()
                for n in (*c.find(Op.INPUT), *c.find(Op.OUTPUT)) if hasattr(n.results[0].type, "shape")}

    want = shapes(stated)
    got = {key: shape for key, shape in shapes(found).items() if key in want}
    assert got == want
