"""Distil a drafter from a target: corpus -> teacher data -> training -> evaluation -> export.

Run `python -m specdec.distill --help`. Every stage writes to disk and resumes where a stopped run left off.
"""
