"""Command line: ``python -m torch_uqr {bench,formats,generate,eval}``."""
import argparse
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "bench": ("torch_uqr.cli.bench", "router benchmark: formats x M x shapes against dequantize+matmul; --model: a GGUF's tok/s"),
        "formats": ("torch_uqr.cli.formats", "bits per weight, error and quantize time of every format"),
        "generate": ("torch_uqr.cli.generate", "run a GGUF model of any architecture (default: SmolLM2-135M)"),
        "eval": ("torch_uqr.cli.evaluate", "perplexity of the default model in every format"),
    }
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        p = argparse.ArgumentParser(prog="python -m torch_uqr")
        p.add_argument("command", choices=sorted(commands))
        print(p.format_usage().strip())
        for name, (_, text) in commands.items():
            print(f"  {name:10s} {text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    import importlib
    module = importlib.import_module(commands[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
