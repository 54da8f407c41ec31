"""The extension module exports its init function alone. What it links statically
(the library, CUDA's runtime, libstdc++ where a toolchain links that statically)
must stay private: exported, those symbols bind to the copies another extension
loaded first, and two halves of one runtime crash (src/python/CMakeLists.txt)."""

import shutil
import subprocess
import sys

import pytest

from stsa import _stsa


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the export list is an ELF linker script")
def test_the_module_exports_its_init_function_alone():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to read the module's dynamic symbols")
    listing = subprocess.run([nm, "-D", "--defined-only", _stsa.__file__], capture_output=True, text=True, check=True)
    exported = sorted(line.split()[-1] for line in listing.stdout.splitlines() if line.strip())
    assert exported == ["PyInit__stsa"], f"{len(exported)} exported, e.g. {exported[:8]}"
