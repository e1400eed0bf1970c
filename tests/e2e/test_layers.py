"""scripts/check_layers.py: no #include in the repository runs against the
layers (runtime -> collective -> amp -> models -> launch, and runtime's rooms
core -> kernels -> ir -> cuda -> ops -> optim -> passes -> exec -> io -> data),
and the check itself catches each kind of break on a small made-up tree."""
import subprocess
import sys
import tempfile
from pathlib import Path

from mixtest import SOURCE_DIR, Checks, workdir

SCRIPT = SOURCE_DIR / "scripts" / "check_layers.py"


def run(root):
    r = subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


WORK = workdir("layers")  # removed at exit, with every made-up tree in it


def tree(files):
    """A made-up repository: {path: text}."""
    d = Path(tempfile.mkdtemp(dir=WORK))
    for path, text in files.items():
        (d / path).parent.mkdir(parents=True, exist_ok=True)
        (d / path).write_text(text)
    return d


c = Checks("layers")
rc, out = run(SOURCE_DIR)
c.check(rc == 0, "the repository's includes follow the layers", out.strip().splitlines()[-1] if out.strip() else "")
if rc != 0:
    print(out)

base = {
    "runtime/core/tensor.h": "#pragma once\n#include <vector>\n",
    "runtime/ir/program.h": '#pragma once\n#include "runtime/core/tensor.h"\n',
    "collective/communicator.h": '#pragma once\n#include "runtime/ir/program.h"\n',
    "amp/lists.h": '#pragma once\n#include "collective/communicator.h"\n#include "amp/other.h"\n',
    "amp/other.h": "#pragma once\n",
}
rc, out = run(tree(base))
c.check(rc == 0, "a tree that includes only downwards passes", out.strip())

cases = [
    ("a lower room including a higher one",
     {"runtime/core/tensor.h": '#include "runtime/ir/program.h"\n'}, "runtime/core/tensor.h:1"),
    ("runtime including collective",
     {"runtime/ir/program.h": '#include "collective/communicator.h"\n'}, "runtime/ir/program.h:1"),
    ("collective including amp",
     {"collective/communicator.h": '#include "amp/lists.h"\n'}, "collective/communicator.h:1"),
    ("a file in runtime/'s root", {"runtime/stray.h": "#pragma once\n"}, "runtime/stray.h"),
    ("the library including tests/", {"amp/other.h": '#include "tests/unit/helper.h"\n'}, "amp/other.h:1"),
    ("an include of a file that does not exist", {"amp/other.h": '#include "amp/gone.h"\n'}, "amp/gone.h"),
]
for what, change, names in cases:
    rc, out = run(tree({**base, **change}))
    c.check(rc == 1 and names in out, f"caught: {what}", out.strip().splitlines()[0] if out.strip() else "no output")
c.finish()
