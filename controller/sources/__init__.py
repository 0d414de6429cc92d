"""Metric sources: Prometheus (PromQL) and the built-in scraper, both producing the schema's MetricWindow."""

from controller.sources.base import InstanceInfo, Query, Readout, SeriesReader, SourceUnavailableError, Topology
from controller.sources.prometheus import PrometheusReader, promql
from controller.sources.scrape import ScrapeReader
from controller.sources.source import MetricSource, Observed
from controller.sources.window import INSTANCE_METRICS, ROUTER_METRICS, WindowBuilder, WindowQueries

__all__ = [
    "INSTANCE_METRICS",
    "ROUTER_METRICS",
    "InstanceInfo",
    "MetricSource",
    "Observed",
    "PrometheusReader",
    "Query",
    "Readout",
    "ScrapeReader",
    "SeriesReader",
    "SourceUnavailableError",
    "Topology",
    "WindowBuilder",
    "WindowQueries",
    "promql",
]
