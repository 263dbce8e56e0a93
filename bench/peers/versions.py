"""Prints the peers' versions and the build facts that decide their speed: torch's BLAS and
oneDNN, its CPU capability, thread counts and the CPU model. Every comparing bench/run_*.sh
prints this before its figures. Runs under the peers' virtual environment."""
import importlib
import os
import platform
import subprocess


def version_of(module):
    try:
        return importlib.import_module(module).__version__
    except Exception as error:  # a peer that is not installed or fails to import
        return f"not available ({type(error).__name__}: {str(error).splitlines()[0][:80]})"


def cpu_model():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    print(f"peers: python {platform.python_version()}; torch {version_of('torch')}; "
          f"torchvision {version_of('torchvision')}; dali {version_of('nvidia.dali')}; "
          f"spdl {version_of('spdl.io')}; ffcv {version_of('ffcv')}")
    try:
        import torch
        config = torch.__config__.show()
        wanted = ("GCC", "C++ Version", "Intel(R)", "MKL", "MKL-DNN", "oneDNN", "OpenMP",
                  "LAPACK", "CPU capability", "BLAS_INFO", "USE_MKL", "USE_MKLDNN")
        essentials = []
        for line in config.splitlines():
            line = line.strip(" -")
            if any(key in line for key in wanted):
                essentials.append(line if len(line) < 140 else line[:140] + "...")
        print("torch config: " + " | ".join(essentials))
        print(f"torch threads: intra-op {torch.get_num_threads()}, inter-op "
              f"{torch.get_num_interop_threads()}; OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS', 'unset')}")
    except Exception as error:
        print(f"torch config: not available ({error})")
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
