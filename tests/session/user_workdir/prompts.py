def to_example(row):
    return {
        "prompt": f"What is {row['a']}+{row['b']}? Answer:",
        "completion": f" {row['a'] + row['b']}",
    }
