"""One sub-package per speculative method; each registers itself with `vllm_specx.registry` on
import (the registry imports every sub-package here, so adding a folder adds a method)."""
