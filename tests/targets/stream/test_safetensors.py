"""Weight-file headers checked whole before the first layer (``targets.stream.safetensors``): issue 49's "also seen"
raw ``SafetensorError: ... invalid offset`` mid-run, now one line of depthlab's naming the file and the tensor."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from depthlab.base.errors import DepthlabError
from depthlab.targets.stream.safetensors import read_header


def _rewrite(path: Path, edit) -> None:
    """``path`` with its header edited by ``edit(header, data) -> data`` (the data section may grow)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    data = edit(header, data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize("case", ["gap", "overlap"])
def test_tensors_that_do_not_tile_the_data_section_are_refused_as_safetensors_itself_would(tmp_path, case):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.ones(4), "b": torch.zeros(4)}, str(path))

    def edit(header, data):
        if case == "gap":  # b moved 4 bytes on, 4 bytes appended: every entry fits its shape and the file
            header["b"]["data_offsets"] = [20, 36]
            return data + bytes(4)
        header["b"]["data_offsets"] = [8, 24]  # b overlaps a, the last 8 bytes owned by no one
        return data

    _rewrite(path, edit)
    with pytest.raises(Exception, match="(?i)offset"):  # the attack is real: safetensors refuses the file on open
        with safe_open(str(path), "pt") as f:
            f.get_tensor("b")
    with pytest.raises(DepthlabError, match=f"tensor 'b' starts at byte .* \\(an? {case}\\)"):
        read_header(path)


def test_a_well_formed_file_passes(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.ones(4), "b": torch.zeros(2, 3), "c": torch.ones(1, dtype=torch.bfloat16)}, str(path))
    assert set(read_header(path)) == {"a", "b", "c"}
