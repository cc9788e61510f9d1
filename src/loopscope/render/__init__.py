"""render: reports, their tables and figures, the front page; an edit reruns no
measurement or claim."""
