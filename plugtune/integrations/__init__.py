"""plugtune as the plugin layer of distributed training engines (one module per engine).

``recording`` (engine-neutral) records an engine's run as a plugtune job; ``trl`` adapts
TRL's ``GRPOTrainer`` (``pip install -e '.[trl]'``). Each engine module imports its engine; the
core never imports these modules.
"""
