"""python3 -m kreg: what kreg found here (its prefix, plugins and kernels)."""
import kreg

if __name__ == "__main__":
    print(f"kreg at {kreg.install_prefix()}")
    for k in kreg.Registry().kernels():
        print(f"  {k.name}{'' if k.available else '  (' + k.why_unavailable + ')'}")
