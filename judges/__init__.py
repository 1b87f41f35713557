"""Everything that scores responses: dynamic/static rubrics, scalar reward models, LLM-as-judge protocols, their prompts."""
