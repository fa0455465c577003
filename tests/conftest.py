"""The suite's fixtures come from one plugin in tests/helpers; see tests/unit/test_suite_layout.py."""

pytest_plugins = [
    "tests.helpers.fixtures",
    "tests.helpers.broker_fixtures",
    "tests.helpers.dashboard_fixtures",
    "pytester",
]
