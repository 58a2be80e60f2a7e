//! The 1,000 ILSVRC2012 classes: the one label space of every source (an ImageFolder's sorted class
//! folders, the integer labels of WebDataset shards and of the Hugging Face parquet files, which count
//! in this same order), recorded as WordNet ids.

const SYNSETS_TXT: &str = include_str!("../assets/synsets.txt");

/// The 1,000 ILSVRC2012 WordNet ids, sorted (ImageFolder's class order; index = label).
pub fn wnids() -> Vec<&'static str> {
    SYNSETS_TXT
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// The 1,000 ILSVRC2012 classes in ImageFolder's order, each as its synset line: the WordNet id, then its
/// names (`n01440764 tench, Tinca tinca`).
pub fn classes() -> Vec<&'static str> {
    SYNSETS_TXT
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// Whether `name` has a WordNet id's form (`n` and 8 digits).
pub fn is_wnid(name: &str) -> bool {
    name.len() == 9 && name.starts_with('n') && name[1..].bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_1000_classes_are_sorted_wordnet_ids() {
        let wnids = super::wnids();
        assert_eq!(wnids.len(), 1000);
        assert_eq!(super::classes().len(), 1000);
        assert_eq!(wnids[0], "n01440764");
        assert!(wnids.windows(2).all(|w| w[0] < w[1]));
        assert!(wnids.iter().all(|w| super::is_wnid(w)));
        assert!(!super::is_wnid("tench") && !super::is_wnid("n0144076x"));
    }
}
