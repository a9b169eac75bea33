"""What CMake needs to build handgrad._torch_ext against the PyTorch that this
interpreter imports (python/src/torch_ext/CMakeLists.txt): one key=value line
each, lists joined by '|'; `error=...` when PyTorch cannot be imported. The
same facts torch.utils.cpp_extension uses to build an extension."""
import inspect
import os
import re
import sys

try:
    import torch
except Exception as e:  # not installed, or broken: the extension is skipped, with this reason
    print(f"error=import torch failed ({type(e).__name__}: {e})")
    sys.exit(0)

try:
    from torch.utils import cpp_extension
    include, lib = cpp_extension.include_paths(), cpp_extension.library_paths()
    std_flags = re.findall(r"-std=c\+\+(\d+)", inspect.getsource(cpp_extension))
except Exception:  # cpp_extension needs setuptools; the layout is the same without it
    root = os.path.dirname(torch.__file__)
    include = [os.path.join(root, "include"), os.path.join(root, "include", "torch", "csrc", "api", "include")]
    lib, std_flags = [os.path.join(root, "lib")], []

print(f"version={torch.__version__}")
print("include=" + "|".join(include))
print("lib=" + "|".join(lib))
print(f"cxx11_abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
print(f"cuda={int(torch.version.cuda is not None)}")
# The C++ standard PyTorch's own extension builder asks for, at least C++17 (handgrad's).
print(f"cxx_standard={max([17] + [int(s) for s in std_flags if s in ('17', '20', '23')])}")
# pybind11's ABI tags, so the extension shares pybind11's internals with torch._C (as
# cpp_extension passes them; newer PyTorch may have none).
defs = [f'PYBIND11_{n}="{getattr(torch._C, f"_PYBIND11_{n}")}"' for n in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI")
        if getattr(torch._C, f"_PYBIND11_{n}", None) is not None]
print("pybind11_defs=" + "|".join(defs))
