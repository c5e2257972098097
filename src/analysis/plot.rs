//! Figures, each drawn once for PNG and once for SVG. The PNGs use the bundled DejaVu Sans,
//! so that reports look the same on machines without fonts.

use plotters::coord::Shift;
use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters_backend::DrawingErrorKind;
use std::path::{Path, PathBuf};

static FONT: &[u8] = include_bytes!("fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

fn ensure_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT);
    });
}

/// What drawing on backend `DB` returns: plotters' own error, whose backend part is `DB`'s
/// (a figure draws on PNG and SVG alike, so it cannot name one); [`save`] adds the file.
pub(crate) type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Something that draws itself on any plotters backend.
pub trait Figure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB>;
    fn size(&self) -> (u32, u32) {
        (1000, 600)
    }
}

/// Why a figure's file could not be written. Each names the file; the texts are plotters' own.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The backend could not draw or write the file: a full disk, a folder that cannot be
    /// written, an image the encoder refused.
    #[error("{path}: backend error: Drawing backend error: {source}")]
    Backend {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The font could not lay out a label's text.
    #[error("{path}: backend error: Font loading error: {source}")]
    Font {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A figure split its area into parts plotters refused, or drew on an area in use: a
    /// bug in the figure, not in the data.
    #[error("{path}: {problem}")]
    Layout {
        path: PathBuf,
        problem: &'static str,
    },
}

impl PlotError {
    fn at<E: std::error::Error + Send + Sync + 'static>(
        path: &Path,
    ) -> impl FnOnce(DrawingAreaErrorKind<E>) -> Self {
        move |e| {
            let path = path.to_path_buf();
            match e {
                DrawingAreaErrorKind::BackendError(DrawingErrorKind::DrawingError(e)) => {
                    PlotError::Backend {
                        path,
                        source: Box::new(e),
                    }
                }
                DrawingAreaErrorKind::BackendError(DrawingErrorKind::FontError(source)) => {
                    PlotError::Font { path, source }
                }
                DrawingAreaErrorKind::SharingError => PlotError::Layout {
                    path,
                    problem: "Multiple backend operation in progress",
                },
                DrawingAreaErrorKind::LayoutError => PlotError::Layout {
                    path,
                    problem: "Bad layout",
                },
            }
        }
    }
}

/// The figures a report draws into its folder, named in the order they were drawn (the
/// report's page lists them so).
pub(crate) struct FigureFolder<'a> {
    dir: &'a Path,
    names: Vec<String>,
}

impl<'a> FigureFolder<'a> {
    pub fn into(dir: &'a Path) -> Self {
        FigureFolder {
            dir,
            names: Vec::new(),
        }
    }

    /// Writes `figure` as `<name>.png` and `<name>.svg` in the folder, and notes its name.
    pub fn save(&mut self, name: &str, figure: &impl Figure) -> Result<(), PlotError> {
        save(figure, &self.dir.join(name))?;
        self.names.push(name.to_string());
        Ok(())
    }

    /// The names of the figures drawn, in order.
    pub fn names(self) -> Vec<String> {
        self.names
    }
}

/// Writes `<stem>.png` and `<stem>.svg`.
pub fn save(figure: &impl Figure, stem: &Path) -> Result<(), PlotError> {
    ensure_font();
    let size = figure.size();
    let png = stem.with_extension("png");
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        root.fill(&WHITE).map_err(PlotError::at(&png))?;
        figure.draw(&root).map_err(PlotError::at(&png))?;
        root.present().map_err(PlotError::at(&png))?;
    }
    let svg = stem.with_extension("svg");
    let root = SVGBackend::new(&svg, size).into_drawing_area();
    root.fill(&WHITE).map_err(PlotError::at(&svg))?;
    figure.draw(&root).map_err(PlotError::at(&svg))?;
    root.present().map_err(PlotError::at(&svg))
}

fn color(i: usize) -> RGBColor {
    // Colour-blind-safe (Okabe-Ito), then a fallback palette.
    const OKABE_ITO: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(230, 159, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(86, 180, 233),
        RGBColor(213, 94, 0),
        RGBColor(240, 228, 66),
        RGBColor(0, 0, 0),
    ];
    if i < OKABE_ITO.len() {
        OKABE_ITO[i]
    } else {
        let c = Palette99::pick(i).to_rgba();
        RGBColor(c.0, c.1, c.2)
    }
}

/// A series: its name and `(x, mean, low, high)` points.
#[derive(Debug, Clone)]
pub struct Band {
    pub name: String,
    pub points: Vec<(f64, f64, f64, f64)>,
}

impl Band {
    /// A plain line: `(x, y)` points with no band.
    pub fn line(name: impl Into<String>, points: impl IntoIterator<Item = (f64, f64)>) -> Self {
        Self {
            name: name.into(),
            points: points.into_iter().map(|(x, y)| (x, y, y, y)).collect(),
        }
    }
}

/// Lines over x, each with a shaded confidence band.
#[derive(Debug, Clone)]
pub struct Lines {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Band>,
    /// Mark the points (for few of them, e.g. population sizes).
    pub markers: bool,
}

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    // A flat series (no bankruptcies, a fixed price) gets a readable span around its value
    // rather than one of a billionth.
    let pad = if hi - lo > 1e-12 {
        (hi - lo) * 0.05
    } else {
        (lo.abs() * 0.1).max(1.0)
    };
    (lo - pad, hi + pad)
}

impl Lines {
    fn draw_on<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        let (x0, x1) = range(
            self.series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0)),
        );
        let (y0, y1) = range(
            self.series
                .iter()
                .flat_map(|s| s.points.iter().flat_map(|p| [p.2, p.3])),
        );
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, (FAMILY, 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(75)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        // Steps and population sizes are whole numbers: label them so (never 2.0, never
        // 0.2), at most ten of them.
        let whole_x = self
            .series
            .iter()
            .flat_map(|s| &s.points)
            .all(|p| p.0.fract() == 0.0);
        let whole = |x: &f64| match (x - x.round()).abs() < 1e-9 {
            true => format!("{}", x.round() as i64),
            false => String::new(),
        };
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .label_style((FAMILY, 14))
            .axis_desc_style((FAMILY, 16))
            .light_line_style(WHITE.mix(0.0));
        if whole_x {
            let span = (x1 - x0).floor().max(1.0) as usize;
            mesh.x_labels((span + 1).min(10)).x_label_formatter(&whole);
        }
        mesh.draw()?;
        for (i, s) in self.series.iter().enumerate() {
            let c = color(i);
            if s.points.iter().any(|p| p.3 > p.2) {
                let mut poly: Vec<(f64, f64)> = s.points.iter().map(|p| (p.0, p.3)).collect();
                poly.extend(s.points.iter().rev().map(|p| (p.0, p.2)));
                chart.draw_series(std::iter::once(Polygon::new(poly, c.mix(0.18))))?;
            }
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().map(|p| (p.0, p.1)),
                    c.stroke_width(2),
                ))?
                .label(&s.name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3))
                });
            if self.markers {
                chart.draw_series(
                    s.points
                        .iter()
                        .map(|p| Circle::new((p.0, p.1), 4, c.filled())),
                )?;
            }
        }
        if self.series.len() > 1 && self.series.len() <= 12 {
            chart
                .configure_series_labels()
                .label_font((FAMILY, 14))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()?;
        }
        Ok(())
    }
}

impl Figure for Lines {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        self.draw_on(root)
    }
}

/// Line charts in a grid, filled row by row (e.g. a row per arm, a column per population).
#[derive(Debug, Clone)]
pub struct Grid {
    pub columns: usize,
    pub panels: Vec<Lines>,
}

impl Grid {
    fn shape(&self) -> (usize, usize) {
        let columns = self.columns.clamp(1, self.panels.len().max(1));
        (self.panels.len().max(1).div_ceil(columns), columns)
    }
}

impl Figure for Grid {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        for (panel, area) in self.panels.iter().zip(root.split_evenly(self.shape())) {
            panel.draw_on(&area)?;
        }
        Ok(())
    }
    fn size(&self) -> (u32, u32) {
        let (rows, columns) = self.shape();
        let width = if columns == 1 { 1000 } else { 640 * columns };
        (width as u32, 430 * rows as u32)
    }
}

/// A network on a circle: nodes grouped (and coloured) by kind, directed links as lines.
#[derive(Debug, Clone)]
pub(crate) struct Network {
    pub title: String,
    /// `(label, group)` per node.
    pub nodes: Vec<(String, String)>,
    pub edges: Vec<(usize, usize)>,
}

impl Figure for Network {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        let mut groups: Vec<&String> = self.nodes.iter().map(|n| &n.1).collect();
        groups.sort();
        groups.dedup();
        // Nodes of a group sit together around the circle.
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.sort_by_key(|&i| (groups.iter().position(|g| *g == &self.nodes[i].1), i));
        let n = self.nodes.len().max(1) as f64;
        let mut at = vec![(0.0, 0.0); self.nodes.len()];
        for (k, &i) in order.iter().enumerate() {
            let a = 2.0 * std::f64::consts::PI * k as f64 / n;
            at[i] = (a.cos(), a.sin());
        }
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FAMILY, 22))
            .margin(20)
            .build_cartesian_2d(-1.5..1.5, -1.2..1.2)?;
        chart.draw_series(
            self.edges
                .iter()
                .map(|&(a, b)| PathElement::new(vec![at[a], at[b]], BLACK.mix(0.15))),
        )?;
        for (g, group) in groups.iter().enumerate() {
            let c = color(g);
            chart
                .draw_series(
                    self.nodes
                        .iter()
                        .enumerate()
                        .filter(|(_, node)| &node.1 == *group)
                        .map(|(i, _)| Circle::new(at[i], 9, c.filled())),
                )?
                .label(group.as_str())
                .legend(move |(x, y)| Circle::new((x + 8, y), 6, c.filled()));
        }
        if self.nodes.len() <= 60 {
            chart.draw_series(self.nodes.iter().enumerate().map(|(i, node)| {
                let (x, y) = at[i];
                Text::new(
                    node.0.clone(),
                    (x * 1.12 - 0.03, y * 1.12 + 0.03),
                    (FAMILY, 12),
                )
            }))?;
        }
        chart
            .configure_series_labels()
            .label_font((FAMILY, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
    }

    fn size(&self) -> (u32, u32) {
        (1000, 800)
    }
}

/// Means of groups with 95% intervals, as bars with error bars: categories along x, one bar
/// per series within each category.
#[derive(Debug, Clone)]
pub(crate) struct Bars {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    pub series: Vec<BarSeries>,
}

/// One series of [`Bars`]: per category `(mean, low, high)`, `None` where the group is empty.
#[derive(Debug, Clone)]
pub(crate) struct BarSeries {
    pub name: String,
    pub values: Vec<Option<(f64, f64, f64)>>,
}

impl Bars {
    /// Long or many labels are written upright, to fit under their bars.
    fn upright(&self) -> bool {
        self.categories.len() > 6 || self.categories.iter().any(|c| c.chars().count() > 14)
    }
}

impl Figure for Bars {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        let n = self.categories.len().max(1) as f64;
        let (_, y1) = range(
            self.series
                .iter()
                .flat_map(|s| s.values.iter().flatten().flat_map(|p| [p.0, p.2])),
        );
        let y0 = self
            .series
            .iter()
            .flat_map(|s| s.values.iter().flatten().map(|p| p.1))
            .fold(0.0f64, f64::min);
        let longest = self
            .categories
            .iter()
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(1);
        let label_area = if self.upright() {
            20 + 8 * longest as u32
        } else {
            40
        };
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FAMILY, 22))
            .margin(12)
            .x_label_area_size(label_area)
            .y_label_area_size(75)
            .build_cartesian_2d(0.0..n, y0..y1.max(y0 + 1e-9))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(&self.y_label)
            .label_style((FAMILY, 14))
            .axis_desc_style((FAMILY, 16))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        let width = 0.8 / self.series.len().max(1) as f64;
        for (s, BarSeries { name, values }) in self.series.iter().enumerate() {
            let c = color(s);
            let x = |i: usize| i as f64 + 0.1 + width * s as f64;
            chart
                .draw_series(values.iter().enumerate().filter_map(|(i, v)| {
                    v.map(|(mean, _, _)| {
                        Rectangle::new([(x(i), 0.0), (x(i) + width, mean)], c.mix(0.75).filled())
                    })
                }))?
                .label(name.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
            chart.draw_series(values.iter().enumerate().filter_map(|(i, v)| {
                v.filter(|(_, lo, hi)| hi > lo).map(|(mean, lo, hi)| {
                    ErrorBar::new_vertical(
                        x(i) + width / 2.0,
                        lo,
                        mean,
                        hi,
                        BLACK.stroke_width(1),
                        8,
                    )
                })
            }))?;
        }
        // Category names under their bars, in the x label area.
        let (xs, ys) = chart.plotting_area().get_pixel_range();
        let px = |i: usize| xs.start + ((i as f64 + 0.5) / n * (xs.end - xs.start) as f64) as i32;
        for (i, label) in self.categories.iter().enumerate() {
            let style = (FAMILY, 13).into_font().color(&BLACK);
            let (style, at) = if self.upright() {
                (
                    style
                        .transform(FontTransform::Rotate270)
                        .pos(Pos::new(HPos::Right, VPos::Center)),
                    (px(i), ys.end + 8),
                )
            } else {
                (
                    style.pos(Pos::new(HPos::Center, VPos::Top)),
                    (px(i), ys.end + 8),
                )
            };
            root.draw(&Text::new(label.clone(), at, style))?;
        }
        if self.series.len() > 1 && self.series.len() <= 12 {
            chart
                .configure_series_labels()
                .label_font((FAMILY, 14))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .position(SeriesLabelPosition::UpperRight)
                .draw()?;
        }
        Ok(())
    }
}

/// One histogram per panel (e.g. per round), each with an optional marked value (the
/// round's target).
#[derive(Debug, Clone)]
pub(crate) struct Histograms {
    pub title: String,
    pub x_label: String,
    pub panels: Vec<HistogramPanel>,
}

/// One histogram: bins as `(low, high, share)`, and a value marked with a line.
#[derive(Debug, Clone)]
pub(crate) struct HistogramPanel {
    pub title: String,
    pub bins: Vec<(f64, f64, f64)>,
    pub mark: Option<f64>,
}

impl Figure for Histograms {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        let (title_area, rest) = root.split_vertically(36);
        title_area.titled(&self.title, (FAMILY, 22))?;
        let areas = rest.split_evenly((self.panels.len().max(1), 1));
        for (
            HistogramPanel {
                title: name,
                bins,
                mark,
            },
            area,
        ) in self.panels.iter().zip(areas)
        {
            let x0 = bins.first().map_or(0.0, |b| b.0);
            let x1 = bins.last().map_or(1.0, |b| b.1);
            let top = bins.iter().map(|b| b.2).fold(0.0f64, f64::max).max(1e-9) * 1.1;
            let mut chart = ChartBuilder::on(&area)
                .caption(name, (FAMILY, 16))
                .margin(8)
                .x_label_area_size(30)
                .y_label_area_size(60)
                .build_cartesian_2d(x0..x1, 0.0..top)?;
            chart
                .configure_mesh()
                .x_desc(&self.x_label)
                .y_desc("share")
                .label_style((FAMILY, 12))
                .light_line_style(WHITE.mix(0.0))
                .draw()?;
            chart.draw_series(bins.iter().map(|&(lo, hi, share)| {
                Rectangle::new([(lo, 0.0), (hi, share)], color(0).mix(0.7).filled())
            }))?;
            if let Some(x) = mark {
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(*x, 0.0), (*x, top)],
                    color(5).stroke_width(2),
                )))?;
            }
        }
        Ok(())
    }

    fn size(&self) -> (u32, u32) {
        (1000, 36 + 220 * self.panels.len().max(1) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A figure that cannot be written says which file, and keeps the backend's error as its
    /// source, so that a report's caller can tell a full disk from a bad figure.
    #[test]
    fn a_figure_that_cannot_be_written_names_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let stem = dir.path().join("no such folder").join("fig");
        let figure = Lines {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![Band::line("a", [(0.0, 1.0), (1.0, 2.0)])],
            markers: false,
        };
        let e = save(&figure, &stem).unwrap_err();
        assert!(
            matches!(&e, PlotError::Backend { path, .. } if path == &stem.with_extension("png")),
            "{e:?}"
        );
        assert!(e.to_string().contains("fig.png"), "{e}");
        assert!(std::error::Error::source(&e).is_some(), "{e}");
    }

    // Guards against issue 39, item 16: a figure over steps 0 to 2 labelled its axis 0.0, 0.2,
    // ... 2.0.
    #[test]
    fn whole_steps_are_labelled_as_whole_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let stem = dir.path().join("fig");
        let labels = |xs: &[f64]| {
            let figure = Lines {
                title: "t".into(),
                x_label: "step".into(),
                y_label: "y".into(),
                series: vec![Band::line("a", xs.iter().map(|&x| (x, x * 0.37)))],
                markers: false,
            };
            save(&figure, &stem).unwrap();
            let svg = std::fs::read_to_string(stem.with_extension("svg")).unwrap();
            // Numeric labels with their height; the x axis's are the lowest on the page.
            let numeric: Vec<(f64, String)> = svg
                .split("<text")
                .skip(1)
                .filter_map(|t| {
                    let (attributes, rest) = t.split_once('>')?;
                    let text = rest.split_once("</text>")?.0.trim().to_string();
                    let y = attributes
                        .split_once("y=\"")?
                        .1
                        .split_once('"')?
                        .0
                        .parse()
                        .ok()?;
                    text.parse::<f64>().is_ok().then_some((y, text))
                })
                .collect();
            let lowest = numeric.iter().map(|n| n.0).fold(f64::MIN, f64::max);
            numeric
                .into_iter()
                .filter(|n| n.0 == lowest)
                .map(|n| n.1)
                .collect::<Vec<_>>()
        };
        for steps in [vec![0.0, 1.0, 2.0], (0..=40).map(f64::from).collect()] {
            let text = labels(&steps);
            assert!(text.len() >= 3 && text.len() <= 10, "{text:?}");
            assert!(
                text.iter().all(|t| t.parse::<i64>().is_ok()),
                "whole numbers only: {text:?}"
            );
        }
    }
}
