from reports.paper import TABLE1, TABLE1_COLUMNS


def test_table1_transcription_is_consistent_with_the_papers_macro_average():
    # Table 3 of the paper reports the full DR-Generator-8B's macro average over the six accuracies as 58.1.
    accs = [TABLE1["DR-Generator-8B"][c] for c in TABLE1_COLUMNS if c.endswith(".acc")]
    assert len(accs) == 6
    assert round(sum(accs) / 6, 1) == 58.1
    assert all(set(row) == set(TABLE1_COLUMNS) for row in TABLE1.values())
    assert all(0 < row[c] < 1 for row in TABLE1.values() for c in TABLE1_COLUMNS if c.endswith(".ndcg"))
