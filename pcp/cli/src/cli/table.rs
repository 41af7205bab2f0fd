//! pasactl's tables, laid out as kubectl and istioctl lay theirs out: every column but the last
//! as wide as its widest cell plus a fixed padding, trailing blanks trimmed.

/// Column padding of kubectl's tables (`pasactl get`).
pub const KUBECTL: usize = 3;
/// Column padding of istioctl's cluster, route and endpoint tables.
pub const WIDE: usize = 5;
/// Column padding of istioctl's listener table.
pub const NARROW: usize = 1;

/// `header` and `rows` as aligned text, one line each.
pub fn render(header: &[&str], rows: &[Vec<String>], padding: usize) -> String {
    let columns = header.len();
    let mut widths = vec![0usize; columns];
    let all = std::iter::once(header.iter().map(|h| h.to_string()).collect::<Vec<_>>())
        .chain(rows.iter().cloned());
    let lines: Vec<Vec<String>> = all.collect();
    for line in &lines {
        for (i, cell) in line.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for line in &lines {
        let mut out = String::new();
        for (i, cell) in line.iter().enumerate().take(columns) {
            out.push_str(cell);
            if i + 1 < columns {
                let fill = widths[i] + padding - cell.chars().count();
                out.extend(std::iter::repeat_n(' ', fill));
            }
        }
        text.push_str(out.trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_the_widest_cell() {
        let rows = vec![
            vec![
                "reviews.default.svc.cluster.local".into(),
                "9080".into(),
                "".into(),
            ],
            vec!["BlackHoleCluster".into(), "-".into(), "".into()],
        ];
        assert_eq!(
            render(&["SERVICE FQDN", "PORT", "DESTINATION RULE"], &rows, WIDE),
            "SERVICE FQDN                          PORT     DESTINATION RULE\n\
             reviews.default.svc.cluster.local     9080\n\
             BlackHoleCluster                      -\n"
        );
    }
}
