# dev experiment: every adaptive guard pinned to 'off' (no speculation, nothing planned) in a served engine
# served A/B: vllm-dflash bench --configs none,none+extras,ours,ours#off \
#   --env "ours#off:PYTHONPATH=<absolute path of dev/pinoff>"
try:
    from vllm_dflash.adaptive import guard as _G
    _init = _G.SpeculationGuard.__init__
    def _pinned(self, *a, **k):
        _init(self, *a, **k)
        self.arm, self._winner, self.rate = "off", "off", {"plan": 0.0, "off": 1.0}
        self.record = lambda *x, **y: None
    _G.SpeculationGuard.__init__ = _pinned
except Exception as e:  # noqa
    import sys; print("pinoff sitecustomize failed", e, file=sys.stderr)
