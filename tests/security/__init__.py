"""Security suites by attack class (issue 31): CVE classes, route completeness, hostile models."""
