"""The web page at ``GET /``: a real uvicorn (tiny checkpoint) driven by Debian's headless chromium through
Selenium. Skips where chromium, chromedriver or selenium is missing (``.ci/run`` installs them with apt)."""

from __future__ import annotations

import base64
import io
import shutil

import httpx
import pytest
import soundfile as sf

from audio8_coreai import TTS
from audio8_coreai.server import create_app, serve_in_thread
from audio8_coreai.settings import ServerSettings
from tests import clips

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="the browser test needs Debian's chromium and chromedriver (apt-get install chromium chromium-driver)",
)
webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs selenium (the test extra)")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

TEXT = "The meeting has been moved to Thursday afternoon."
SETTINGS = ServerSettings(workers=1, max_input_chars=200, max_upload_bytes=1_000_000, max_frames=20, chunk_frames=4)
WAIT_S = 60


def serving(checkpoint, voices):
    """The page's server (one worker, SETTINGS) on ``checkpoint`` in a thread; yields its base URL."""
    with serve_in_thread(create_app([TTS.load(checkpoint, device="cpu", voices_dir=voices)], SETTINGS)) as url:
        yield url


@pytest.fixture(scope="module")
def base(tiny_checkpoint, tmp_path_factory):
    yield from serving(tiny_checkpoint, tmp_path_factory.mktemp("voices"))


@pytest.fixture(scope="module")
def capped(never_eos_long_checkpoint, tmp_path_factory):
    """The server on the checkpoint that never draws eos (steered.py): every request speaks to the frame cap."""
    yield from serving(never_eos_long_checkpoint, tmp_path_factory.mktemp("voices"))


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return clips.write(tmp_path_factory.mktemp("clip") / "rising tone.wav", clips.sweep(22050, 1.5), 22050)


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=900,1100"):
        options.add_argument(arg)
    options.add_argument("--autoplay-policy=no-user-gesture-required")
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    yield driver
    driver.quit()


def wait(browser, condition, timeout: float = WAIT_S):
    return WebDriverWait(browser, timeout).until(lambda d: condition())


def element(browser, id_: str):
    return browser.find_element(By.ID, id_)


def speak(browser, text: str, seed: str = "", temperature: str = "") -> None:
    for id_, value in (("text", text), ("seed", seed), ("temperature", temperature)):
        element(browser, id_).clear()
        if value:
            element(browser, id_).send_keys(value)
    element(browser, "speak").click()


def requested(browser, path: str) -> int:
    """How many times the page has fetched ``path`` since it loaded."""
    names = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return sum(name.endswith(path) for name in names)


def test_the_page_is_served_as_package_data_with_a_strict_policy(base):
    page = httpx.get(f"{base}/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert httpx.get(f"{base}/static/app.js").headers["content-type"] == "text/javascript; charset=utf-8"
    assert httpx.get(f"{base}/static/style.css").headers["content-type"] == "text/css; charset=utf-8"
    assert httpx.get(f"{base}/static/missing.js").status_code == 404
    assert "/" not in httpx.get(f"{base}/openapi.json").json()["paths"]  # the API's schema is the API's alone


def test_page_lists_voices_and_adds_one_by_upload(base, browser, clip):
    files = {"audio": ("clip.wav", clip.read_bytes(), "audio/wav")}
    r = httpx.post(f"{base}/v1/voices", data={"name": "bob", "transcript": "A rising tone."}, files=files, timeout=60)
    assert r.status_code == 201, r.text
    browser.get(f"{base}/")
    assert browser.title == "audio8 text to speech"
    picker = element(browser, "voice")
    wait(browser, lambda: picker.get_attribute("data-loaded") == "1")
    options = picker.find_elements(By.TAG_NAME, "option")
    assert [o.get_attribute("value") for o in options] == ["", "bob"]
    assert options[1].text == "bob (1.5 s)" and element(browser, "voice-count").text == "1 stored voice"
    # Every file the page loaded came from this server (the policy allows nothing else).
    loaded = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(name.startswith(base) for name in loaded)

    element(browser, "voice-name").send_keys("ana")
    element(browser, "voice-clip").send_keys(str(clip))
    element(browser, "voice-transcript").send_keys("A rising tone.")
    element(browser, "add-voice").click()
    wait(browser, lambda: "Added the voice ana" in element(browser, "voice-status").text)
    assert element(browser, "voice-status").text == "Added the voice ana (1.5 s)."
    wait(browser, lambda: picker.get_attribute("data-loaded") == "2")
    assert [o.get_attribute("value") for o in picker.find_elements(By.TAG_NAME, "option")] == ["", "ana", "bob"]
    assert picker.get_attribute("value") == "ana"  # the new voice is picked

    element(browser, "add-voice").click()  # again, without replace: the server's refusal, in the page's words
    error = element(browser, "voice-error")
    wait(browser, lambda: error.is_displayed())
    assert error.text == (
        'A voice of that name is stored already: choose another name, or tick "Replace a stored voice of that name".'
    )
    element(browser, "voice-replace").click()
    element(browser, "add-voice").click()
    wait(browser, lambda: "the voice ana" in element(browser, "voice-status").text)
    assert element(browser, "voice-status").text == "Replaced the voice ana (1.5 s)." and not error.is_displayed()


def test_speak_plays_as_it_streams_and_offers_the_whole_wav(capped, browser, tmp_path):
    browser.get(f"{capped}/")
    wait(browser, lambda: element(browser, "voice").get_attribute("data-loaded") is not None)
    speak(browser, TEXT, seed="1", temperature="0.5")
    result = element(browser, "result")
    wait(browser, lambda: result.get_attribute("data-state") in ("done", "error"))
    assert result.get_attribute("data-state") == "done", element(browser, "error").text
    body = {"input": TEXT, "seed": 1, "temperature": 0.5, "response_format": "wav", "stream": False}  # whole file
    whole = httpx.post(f"{capped}/v1/audio/speech", json=body, timeout=WAIT_S)
    audio, rate = sf.read(io.BytesIO(whole.content), dtype="float32")
    assert rate == 44100 and len(audio) == SETTINGS.max_frames * 2048  # the never-eos model runs to the frame cap
    assert int(result.get_attribute("data-samples")) == len(audio)  # every sample was scheduled to play
    status = element(browser, "status").text
    assert status == f"Done: {len(audio) / rate:.2f} s of speech at 44100 Hz, seed 1."
    state, played_s = browser.execute_script("return [context.state, context.currentTime]")
    assert state == "running" and played_s > 0
    download = element(browser, "download")
    url = download.get_attribute("href")
    assert url.startswith("blob:") and element(browser, "player").get_attribute("src") == url
    assert download.get_attribute("download") == "speech.wav"
    duration = wait(browser, lambda: browser.execute_script("return $('player').duration"))  # NaN until read
    assert duration == pytest.approx(len(audio) / rate, abs=1e-3)  # chromium's own decoder reads the whole wav
    fetched = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0]).then(r => r.arrayBuffer()).then(b => {"
        "  let s = ''; for (const c of new Uint8Array(b)) s += String.fromCharCode(c); done(btoa(s));"
        "}, e => done('failed: ' + e));",
        url,
    )
    assert base64.b64decode(fetched) == whole.content  # the streamed bytes, sizes set: the server's whole file
    browser.save_screenshot(str(tmp_path / "page.png"))


def test_empty_text_is_refused_on_the_page_and_server_refusals_are_shown(base, browser):
    browser.get(f"{base}/")
    error, result = element(browser, "error"), element(browser, "result")
    assert not error.is_displayed()
    speak(browser, "   \n ")
    assert error.is_displayed() and error.text == "Type some text to speak: the text box is empty."
    assert result.get_attribute("data-state") == "error" and requested(browser, "/v1/audio/speech") == 0
    speak(browser, "x" * 250)  # over this server's 200 characters: the page sends it, the server refuses it
    wait(browser, lambda: "characters" in error.text)
    assert error.text == "input is 250 characters; this server takes at most 200 per request: split the text"
    assert result.get_attribute("data-state") == "error" and requested(browser, "/v1/audio/speech") == 1


def _spoken(browser) -> None:
    """Wait until the page's Speak has received its whole answer ("done")."""
    result = element(browser, "result")
    wait(browser, lambda: result.get_attribute("data-state") in ("done", "error"))
    assert result.get_attribute("data-state") == "done", element(browser, "error").text


def _held_when_received(browser) -> None:
    """Suspend the page's audio once the first samples are scheduled (what is scheduled then waits to play), then
    wait until the speech is received whole."""
    wait(browser, lambda: int(element(browser, "result").get_attribute("data-samples")) > 0)
    browser.execute_script("context.suspend()")
    _spoken(browser)


def test_stop_stays_enabled_while_the_audio_plays_and_speak_stops_the_earlier_audio(capped, browser):
    browser.get(f"{capped}/")
    wait(browser, lambda: element(browser, "voice").get_attribute("data-loaded") is not None)
    stop, speak_button = element(browser, "stop"), element(browser, "speak")
    speak(browser, TEXT, seed="1")
    _held_when_received(browser)
    assert stop.is_enabled() and speak_button.is_enabled()  # received whole, still to play
    scheduled = browser.execute_script(
        "window.stopped = 0;"
        "for (const s of speech.player.sources) { const own = s.stop.bind(s); s.stop = () => { stopped++; own(); }; }"
        "return speech.player.sources.size"
    )
    assert scheduled > 0
    speak_button.click()  # a new Speak stops the earlier audio before it plays its own
    assert browser.execute_script("return stopped") == scheduled
    _held_when_received(browser)
    stop.click()
    assert browser.execute_script("return speech") is None
    assert not stop.is_enabled() and speak_button.is_enabled()
    speak_button.click()  # played to its end: Stop is disabled then
    _spoken(browser)
    wait(browser, lambda: not stop.is_enabled(), timeout=10)
    assert speak_button.is_enabled() and browser.execute_script("return speech.player.playing") is False


def test_a_double_click_on_speak_sends_one_request(capped, browser):
    browser.get(f"{capped}/")
    wait(browser, lambda: element(browser, "voice").get_attribute("data-loaded") is not None)
    element(browser, "text").clear()
    element(browser, "text").send_keys(TEXT)
    browser.execute_script("$('speak').click(); $('speak').click()")  # both before the first await returns
    _spoken(browser)
    assert requested(browser, "/v1/audio/speech") == 1 and not element(browser, "error").is_displayed()


@pytest.mark.parametrize(
    "broken, said",
    [
        (  # the network: fetch fails
            "window.fetch = () => Promise.reject(new TypeError('Failed to fetch'))",
            "Could not reach the server (Failed to fetch): is audio8 serve still running?",
        ),
        (  # the page's own: a TypeError too, not said as the server's absence
            "window.AudioContext = class { resume() { throw new TypeError('no audio output'); } }",
            "The speech could not be played: no audio output",
        ),
    ],
)
def test_an_unreachable_server_and_an_error_of_the_page_are_told_apart(base, browser, broken, said):
    browser.get(f"{base}/")
    browser.execute_script(broken)
    speak(browser, TEXT)
    error = element(browser, "error")
    wait(browser, lambda: error.is_displayed())
    assert error.text == said and requested(browser, "/v1/audio/speech") == 0
    assert element(browser, "speak").is_enabled() and not element(browser, "stop").is_enabled()


def test_a_voice_deleted_since_the_list_was_read_is_said_and_leaves_the_list(base, browser, clip):
    files = {"audio": ("clip.wav", clip.read_bytes(), "audio/wav")}
    r = httpx.post(f"{base}/v1/voices", data={"name": "gone", "transcript": "A rising tone."}, files=files, timeout=60)
    assert r.status_code == 201, r.text
    browser.get(f"{base}/")
    picker = element(browser, "voice")
    wait(browser, lambda: picker.get_attribute("data-loaded") is not None)
    loaded = int(picker.get_attribute("data-loaded"))
    picker.find_element(By.CSS_SELECTOR, "option[value='gone']").click()
    assert httpx.delete(f"{base}/v1/voices/gone").status_code == 200
    speak(browser, TEXT)
    error = element(browser, "error")
    wait(browser, lambda: error.is_displayed())
    assert error.text == "That voice is no longer on the server (deleted since the list was read): pick another."
    wait(browser, lambda: picker.get_attribute("data-loaded") == str(loaded - 1))  # the list read again
    assert "gone" not in [o.get_attribute("value") for o in picker.find_elements(By.TAG_NAME, "option")]
