"""Scenario families: distributions over scenarios, and a generator that draws one valid scenario per seed.

Entry points: :func:`load_family` (a validated :class:`ScenarioFamily`), :func:`generate_scenario` (family, seed →
:class:`~env.scenario.Scenario`, what a trainer calls) and :func:`scenario_yaml` (the same as file text,
byte-identical per family and seed). The knobs are documented in ``docs/scenario-families.md``.
"""

from env.families.archetypes import ARCHETYPES, Archetype
from env.families.config import SPLITS, FamilyError, ScenarioFamily, load_family, parse_family
from env.families.generate import generate_scenario, scenario_name, scenario_yaml

__all__ = [
    "ARCHETYPES",
    "SPLITS",
    "Archetype",
    "FamilyError",
    "ScenarioFamily",
    "generate_scenario",
    "load_family",
    "parse_family",
    "scenario_name",
    "scenario_yaml",
]
