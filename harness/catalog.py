"""What the harness ships, by kind and name, each as the `module:attribute` that defines it: the one place to add
a backend, a model alias, a benchmark, an evaluator, a policy judge or a table.

The registry (`harness.registry`) reads this table and imports an entry's module only when the entry is looked
up, so listing names costs no import. An entry's module defines the object and never registers it itself; a
plugin or a test adds its own with `harness.registry.declare` (a target) or `register` (an object).
"""

from __future__ import annotations

BUILTIN: dict[str, dict[str, str]] = {
    "backend": {
        "openai": "harness.backends.openai_backend:OpenAIBackend",
        "hf": "harness.backends.hf:HFBackend",
        "vllm": "harness.backends.vllm_backend:VLLMBackend",
    },
    "model": {
        "smollm2-135m": "harness.backends.models:SMOLLM2_135M",
        "gemma3-270m": "harness.backends.models:GEMMA3_270M",
    },
    "benchmark": {
        "judgebench": "benchmarks.judgebench:JUDGEBENCH",
        "judgebench_claude": "benchmarks.judgebench:JUDGEBENCH_CLAUDE",
        "rm_bench": "benchmarks.rm_bench:RM_BENCH",
        "ultrafeedback": "benchmarks.ultrafeedback:ULTRAFEEDBACK",
        "personalized_rb": "benchmarks.personalized_rb:PERSONALIZED_RB",
        "aeollm": "benchmarks.aeollm:AEOLLM_BENCHMARK",
        "nectar_lmsys": "benchmarks.nectar:NECTAR_LMSYS",
        "alpaca_eval2": "benchmarks.alpaca_eval2:ALPACA_EVAL2",
        "arena_hard_v2": "benchmarks.arena_hard:ARENA_HARD_V2",
        "wildbench": "benchmarks.wildbench:WILDBENCH",
        "writingbench": "benchmarks.writingbench:WRITINGBENCH",
        "math500": "benchmarks.math500:MATH500",
        "mmlu_pro": "benchmarks.mmlu_pro:MMLU_PRO",
        "codescope": "benchmarks.codescope:CODESCOPE",
    },
    "evaluator": {
        "dynamic-rubric": "judges.dynamic:build_dynamic",
        "static-rubric": "judges.dynamic:build_static",
        "scalar-rm": "judges.scalar_rm:build",
        "pairwise-judge": "judges.pairwise:build",
        "rule": "judges.rule:build",
    },
    "judge": {  # a policy benchmark's name -> the class that judges its answers (`judges.policy`)
        "alpaca_eval2": "judges.alpaca:AlpacaJudge",
        "arena_hard_v2": "judges.arena_hard:ArenaHardJudge",
        "wildbench": "judges.wildbench:WildBenchJudge",
        "writingbench": "judges.writingbench:WritingBenchJudge",
        "math500": "judges.math_check:MathChecker",
        "mmlu_pro": "judges.mmlu_pro:MMLUProChecker",
        "codescope": "judges.codescope:CodeScopeChecker",
    },
    "table": {
        "table1": "reports.tables:TABLE1_SPEC",
        "table2": "reports.tables:TABLE2_SPEC",
        "table6": "reports.tables:TABLE6_SPEC",
        "table8": "reports.tables:TABLE8_SPEC",
        "fig3": "reports.tables:FIG3_SPEC",
        "table3": "reports.evaluator_tables:TABLE3_SPEC",
        "table5": "reports.evaluator_tables:TABLE5_SPEC",
        "table7": "reports.evaluator_tables:TABLE7_SPEC",
        "table9": "reports.evaluator_tables:TABLE9_SPEC",
        "fig2": "reports.fig2:FIG2_SPEC",
        "fig2a": "reports.fig2:FIG2A_SPEC",
        "fig2b": "reports.fig2:FIG2B_SPEC",
    },
}
