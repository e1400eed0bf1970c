#!/usr/bin/env python3
"""Checks that no #include runs against mixtrain's layers.

Top level, bottom up: runtime -> collective -> amp -> models -> launch; a file
may include its own layer and those below it. Inside runtime/, the rooms are
ordered the same way (core, kernels, ir, cuda, ops, optim, passes, exec, io,
data): a room may include itself and the rooms before it. tests/ may include
anything. Prints every include that breaks a rule and exits 1; exits 0 when
there is none.

  scripts/check_layers.py [ROOT]    (ROOT: the repository, by default this script's)
"""
import os
import re
import sys

LAYERS = ["runtime", "collective", "amp", "models", "launch"]
RUNTIME_ROOMS = ["core", "kernels", "ir", "cuda", "ops", "optim", "passes", "exec", "io", "data"]
SOURCES = (".h", ".cc", ".cu", ".cuh")
USAGE = """usage: scripts/check_layers.py [ROOT]
Checks that no #include runs against mixtrain's layers (runtime -> collective -> amp -> models -> launch, and
runtime's rooms in order); prints every include that breaks a rule and exits 1, or exits 0 when there is none.
  ROOT   the repository to check (default: the checkout this script is in)"""
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def place(path):
    """(layer index, room index) of a repository path; None outside the layers."""
    parts = path.split("/")
    if parts[0] not in LAYERS:
        return None
    layer = LAYERS.index(parts[0])
    if parts[0] != "runtime":
        return (layer, 0)
    if len(parts) < 3 or parts[1] not in RUNTIME_ROOMS:
        return (layer, -1)  # a file in runtime/'s root, or in a folder that is no room
    return (layer, RUNTIME_ROOMS.index(parts[1]))


def describe(path):
    p = place(path)
    if p is None:
        return path.split("/")[0]
    if p[0] != 0:
        return LAYERS[p[0]]
    return "runtime/" + (RUNTIME_ROOMS[p[1]] if p[1] >= 0 else "(root)")


def check(root):
    problems = []
    for top in LAYERS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                full = os.path.join(dirpath, name)
                path = os.path.relpath(full, root).replace(os.sep, "/")
                here = place(path)
                if here[0] == 0 and here[1] < 0:
                    problems.append(f"{path}: runtime/'s files live in its rooms ({', '.join(RUNTIME_ROOMS)})")
                with open(full, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        there = place(target)
                        if there is None:
                            if target.split("/")[0] == "tests":
                                problems.append(f"{path}:{lineno}: includes {target}: the library never includes tests/")
                            continue  # a system or third-party header
                        if not os.path.exists(os.path.join(root, target)):
                            problems.append(f"{path}:{lineno}: includes {target}, which does not exist")
                            continue
                        if there > here and not (there[0] == here[0] and there[0] != 0):
                            problems.append(f"{path}:{lineno}: {describe(path)} includes {target} "
                                            f"({describe(target)}), which is above it")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(USAGE)
        return 0
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) against the layers")
        return 1
    print("check_layers: every include follows the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
