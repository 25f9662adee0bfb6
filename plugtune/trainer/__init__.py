"""GRPO on a Hugging Face causal LM, with the user's plugins as rollouts and graders.

Import from the modules (this package stays light, so ``config`` loads without torch):
``config.TrainerConfig``, ``model.load_model``, ``grpo.GRPOTrainer`` / ``StepResult``,
``groups.Plugins``, ``protocols.PolicyServer`` / ``PluginFunction`` / ``Caller``,
``checkpoint.latest``, ``testing`` (in-process fakes).
"""
