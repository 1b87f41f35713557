"""From run store to tables: table specs, paper reference numbers, Markdown/LaTeX/CSV, regression comparison."""
