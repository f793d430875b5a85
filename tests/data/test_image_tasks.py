"""Image-text multiple-choice tasks in MMMU's format: parsed as MMMU names them, refused in one line when an image
or an answer is missing, and the built-in shapes task draws what it asks about."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from depthlab.base.errors import DepthlabError

pytest.importorskip("PIL")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis" / "evaluate"))
from vlmdata import mmmu_rows, png_bytes, write_jsonl  # noqa: E402

from depthlab.data.image_tasks import IMAGE, MC_PROMPT, load_image_task  # noqa: E402
from depthlab.data.shapes import COLORS, SHAPES, builtin_image_task, picture, shapes_items  # noqa: E402


def test_mmmu_rows_inline_images_letters_and_open_questions(tmp_path):
    path = write_jsonl(tmp_path / "mmmu.jsonl", mmmu_rows(tmp_path))
    task = load_image_task(str(path))
    assert task.info["skipped_open"] == 1 and len(task.items) == 2
    first, second = task.items
    assert [r.path.name for r in first.images] == ["p0.png"]
    assert first.options == ("a cat", "a dog", "a cow") and first.gold == 1 and first.choices == ("A", "B", "C")
    assert first.context() == (f"What is drawn in {IMAGE}?\nA. a cat\nB. a dog\nC. a cow\n{MC_PROMPT}\nAnswer:")
    assert first.continuations() == (" A", " B", " C")
    # image 1 is named nowhere: it goes first; image 2 is named in option A and stays there
    assert [r.path.name for r in second.images] == ["p1.png", "p2.png"]
    assert second.context().startswith(f"{IMAGE}\nWhich picture matches?\nA. {IMAGE}\nB. neither\n")
    assert second.source == f"{path}:2"


def test_parquet_as_mmmu_ships_it_equals_the_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = mmmu_rows(tmp_path)
    as_bytes = [{**r, **{k: {"bytes": (tmp_path / r[k]).read_bytes(), "path": r[k]} for k in ("image_1", "image_2")
                         if k in r}} for r in rows]
    for r in as_bytes:
        r["options"] = str(r["options"]) if isinstance(r["options"], list) else r["options"]
        r.setdefault("image_2", None)
    pq.write_table(pa.Table.from_pylist(as_bytes), tmp_path / "validation-0.parquet")
    got = load_image_task(str(tmp_path / "*.parquet"))
    want = load_image_task(str(write_jsonl(tmp_path / "m.jsonl", rows)))
    assert [it.context() for it in got.items] == [it.context() for it in want.items]
    assert [it.gold for it in got.items] == [it.gold for it in want.items]
    assert [[r.open().tobytes() for r in it.images] for it in got.items] == \
        [[r.open().tobytes() for r in it.images] for it in want.items]


@pytest.mark.parametrize("change, needle", [
    (lambda r: r.update(image_1="nope.png"), "nope.png' does not exist"),
    (lambda r: r.update(image_1="junk.png"), "cannot read"),
    (lambda r: r.pop("answer"), "no 'answer' field"),
    (lambda r: r.update(answer=""), "no answer"),
    (lambda r: r.update(answer="E"), "answer 'E' is not among the options A, B, C"),
    (lambda r: r.pop("image_1"), "no image"),
    (lambda r: r.update(question="See <image 2>"), "names <image 2> but has no image_2"),
    (lambda r: r.update(options="not a list"), "'options' is a string that is not a list"),
])
def test_bad_items_are_one_line_naming_the_line(tmp_path, change, needle):
    rows = mmmu_rows(tmp_path)
    (tmp_path / "junk.png").write_bytes(b"not a picture at all")
    change(rows[1 - 1])
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DepthlabError) as err:
        load_image_task(str(path))
    msg = str(err.value)
    assert needle in msg and f"{path}:1" in msg and "\n" not in msg, msg


def test_no_file_and_no_items_are_refused(tmp_path):
    with pytest.raises(DepthlabError, match="matches no file"):
        load_image_task(str(tmp_path / "*.parquet"))
    rows = [r for r in mmmu_rows(tmp_path) if r["question_type"] == "open"]
    with pytest.raises(DepthlabError, match=r"holds no multiple-choice items \(1 open questions\)"):
        load_image_task(str(write_jsonl(tmp_path / "open.jsonl", rows)))


def test_a_data_url_and_an_images_list(tmp_path):
    import base64

    url = "data:image/png;base64," + base64.b64encode(png_bytes(3)).decode()
    path = write_jsonl(tmp_path / "x.jsonl", [{"question": "Q?", "options": ["x", "y"], "answer": 1,
                                               "images": [url, url]}])
    item = load_image_task(str(path)).items[0]
    assert len(item.images) == 2 and item.gold == 1 and item.context().startswith(f"{IMAGE}\n{IMAGE}\nQ?\n")


def _components(mask) -> int:
    """Connected 4-neighbour components of a boolean grid (a naive flood fill)."""
    h, w = len(mask), len(mask[0])
    seen, n = set(), 0
    for y in range(h):
        for x in range(w):
            if mask[y][x] and (y, x) not in seen:
                n += 1
                stack = [(y, x)]
                while stack:
                    cy, cx = stack.pop()
                    if (cy, cx) in seen or not (0 <= cy < h and 0 <= cx < w) or not mask[cy][cx]:
                        continue
                    seen.add((cy, cx))
                    stack += [(cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)]
    return n


@pytest.mark.parametrize("shape", SHAPES)
def test_a_picture_holds_count_shapes_of_its_colour_and_nothing_else(shape):
    import random

    for count in (1, 2, 3, 4):
        color = tuple(COLORS)[count - 1]
        im = picture(shape, color, count, random.Random(count))
        px = im.load()
        mask = [[px[x, y] != (255, 255, 255) for x in range(im.width)] for y in range(im.height)]
        assert {px[x, y] for x in range(im.width) for y in range(im.height)} == {(255, 255, 255), COLORS[color]}
        assert _components(mask) == count, (shape, count)


def test_builtin_shapes_is_deterministic_balanced_and_answered_by_the_picture():
    a, b = builtin_image_task("builtin-shapes"), builtin_image_task("builtin-shapes", limit=10)
    assert len(a.items) == 200 and len(b.items) == 10
    assert [x.images[0].open().tobytes() for x in a.items[:10]] == [x.images[0].open().tobytes() for x in b.items]
    for kind in range(3):  # each question's four answers all occur, none more than twice as often as chance
        golds = [it.gold for it in a.items[kind::3]]
        assert all(0 < golds.count(g) < 2 * len(golds) / 4 for g in range(4)), golds
    other = shapes_items(10, seed=1)
    assert [x.images[0].open().tobytes() for x in other] != [x.images[0].open().tobytes() for x in b.items]


def test_an_image_folder_with_an_unreadable_file_is_refused_before_any_work(tmp_path):
    from depthlab.data.images import check_image_folder, check_image_spec

    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for k in range(2):
            (tmp_path / cls / f"{k}.png").write_bytes(png_bytes(k))
    assert check_image_folder(tmp_path) == ["cat", "dog"] and check_image_spec(str(tmp_path)) == str(tmp_path)
    (tmp_path / "dog" / "2.png").write_bytes(png_bytes(9)[:60])  # a cut file: the header reads, the data does not
    with pytest.raises(DepthlabError) as err:
        check_image_spec(str(tmp_path))
    assert "2.png" in str(err.value) and "cannot read image" in str(err.value) and "\n" not in str(err.value)
