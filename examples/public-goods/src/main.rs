//! `public-goods`: throng's whole command line (`run`, `--resume`, `report`, `plan`, ranks)
//! with one more scenario, registered here; nothing in throng is edited.

fn main() -> std::process::ExitCode {
    throng::cli::main_with(
        throng::scenarios::Registry::builtin().with::<public_goods::PublicGoods>(),
    )
}
