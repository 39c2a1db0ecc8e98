"""Eviction policies (kvpress presses with the paper's settings) and the kept-index recorder."""

from fairkv.presses.recording import RecordingPress
from fairkv.presses.registry import POLICIES, Policy, PolicyError, check_ratio, get_policy, make_press

__all__ = ["POLICIES", "Policy", "PolicyError", "RecordingPress", "check_ratio", "get_policy", "make_press"]
