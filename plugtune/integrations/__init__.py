"""plugtune as the plugin layer of distributed training engines (one module per engine).

``recording`` (engine-neutral) records an engine's run as a plugtune job and ``token_gateway``
puts the policy gateway in front of an engine's token-in/token-out generation; ``trl`` adapts
TRL's ``GRPOTrainer`` (``pip install -e '.[trl]'``), ``trl_vllm`` answers its rollouts with TRL's
vLLM client and ``vllm_server`` is a CPU stand-in for the vLLM server that client talks to;
``verl`` (with ``verl_trajectory``) is verl's agent loop and reward function. Each engine module
imports its engine; the core never imports these modules.
"""
