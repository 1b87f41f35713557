"""Prompt templates of the judges, as package data (`{{slot}}` placeholders; see `judges.templates`)."""
