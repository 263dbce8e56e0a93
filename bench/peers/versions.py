"""Prints the peers' versions and the build facts that decide their speed: torch's BLAS and
oneDNN, its CPU capability, thread counts and the CPU model. Every comparing bench/run_*.sh
prints this before its figures. Runs under the peers' virtual environment."""
import importlib
import importlib.metadata
import os
import platform
import subprocess


def version_of(module, distribution):
    """The installed distribution's version (FFCV 1.0.2's __version__ says 0.0.3rc1), once the
    module imports; else why not."""
    try:
        importlib.import_module(module)
        return importlib.metadata.version(distribution)
    except Exception as error:  # a peer that is not installed or fails to import
        return f"not available ({type(error).__name__}: {str(error).splitlines()[0][:80]})"


def spdl_works():
    """SPDL imports without FFmpeg and fails on its first call: decode one tiny JPEG."""
    try:
        import io

        import numpy as np
        import spdl.io
        from PIL import Image
        buffer = io.BytesIO()
        Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(buffer, format="JPEG")
        spdl.io.decode_packets(spdl.io.demux_image(buffer.getvalue()))
        return ""
    except Exception as error:
        return f" (but decoding fails: {type(error).__name__}: {str(error).splitlines()[0][:80]})"


def cpu_model():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    print(f"peers: python {platform.python_version()}; torch {version_of('torch', 'torch')}; "
          f"torchvision {version_of('torchvision', 'torchvision')}; "
          f"dali {version_of('nvidia.dali', 'nvidia-dali-cuda130')}; "
          f"spdl {version_of('spdl.io', 'spdl-io')}{spdl_works()}; "
          f"ffcv {version_of('ffcv', 'ffcv')}")
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
