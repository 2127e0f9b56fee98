"""What a reader sees, built from reference runs: the README's and docs' headlines and study pages (`headlines`,
`study_docs`) and the HTML report (`report`)."""
