"""``python -m torch_uqr formats`` on a small matrix: every row present, numbers consistent."""
import torch_uqr as uqr
from torch_uqr.cli import formats as formats_table
from torch_uqr.formats.table import format_cases


def test_formats_command_prints_every_format(capsys):
    assert formats_table.main(["--size", "256", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    table = {r[0].strip(): [c.strip() for c in r[1:]] for r in rows[1:]}
    expected = [f if g is None else f"{f} g={g}" for f, g in format_cases()]
    assert sorted(table) == sorted(expected)
    assert table["q4_0"][0] == "4.50" and table["ternary"][0] == "3.00" and table["mlx4 g=128"][0] == "4.25"
    gauss = {name: float(cells[1]) for name, cells in table.items()}
    heavy = {name: float(cells[2]) for name, cells in table.items()}
    assert gauss["q8_0"] < gauss["q4_k"] < gauss["q4_0"] < gauss["exl3"] < gauss["ternary"]
    assert heavy["var_affine"] < heavy["q4_1"]
    assert all(cells[3].endswith(" s") and cells[4].endswith(" s") for cells in table.values())


def test_formats_command_rejects_bad_size(capsys):
    import pytest
    with pytest.raises(SystemExit):
        formats_table.main(["--size", "100"])
    assert "multiple of 256" in capsys.readouterr().err


def test_formats_command_takes_a_subset(capsys):
    import pytest
    assert formats_table.main(["--size", "256", "--formats", "q4_0,mlx4"]) == 0
    rows = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "---" not in line][1:]
    assert rows == ["q4_0", "mlx4 g=32", "mlx4 g=64", "mlx4 g=128"]
    with pytest.raises(SystemExit):
        formats_table.main(["--formats", "q9_9"])
    assert "--formats: unknown format 'q9_9'" in capsys.readouterr().err
