"""Layer 2: offline quantization algorithms (rotation, Hessians, block GPTQ, layer-wise driver)."""
