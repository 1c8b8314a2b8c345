"""Tests of specdec_cli.report: reports, recipes and the losslessness verifier."""
